//! Parsing of the forwarding headers: RFC 7239 `Forwarded`, `X-Forwarded-For` and
//! `X-Real-IP`.
//!
//! Everything here reads text a client may have written: nothing panics, and whatever does
//! not parse cleanly is an opaque [`Hop`], never a guess.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::ControlFlow;

use http::header::{HeaderMap, HeaderName, FORWARDED};
use smallvec::SmallVec;

/// The elements of one `Forwarded` line kept inline (more take an allocation): a chain
/// rarely has more hops than this.
const INLINE_ELEMENTS: usize = 8;

/// A header that names the hops a request went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ForwardingHeader {
    /// RFC 7239 `Forwarded`: a list of elements, whose `for=` parameters are the hops.
    Forwarded,
    /// `X-Forwarded-For`: a list of nodes.
    XForwardedFor,
    /// `X-Real-IP`: one node.
    XRealIp,
}

impl ForwardingHeader {
    pub(super) const ALL: [ForwardingHeader; 3] = [
        ForwardingHeader::Forwarded,
        ForwardingHeader::XForwardedFor,
        ForwardingHeader::XRealIp,
    ];

    pub(super) fn name(self) -> HeaderName {
        match self {
            ForwardingHeader::Forwarded => FORWARDED,
            ForwardingHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardingHeader::XRealIp => HeaderName::from_static("x-real-ip"),
        }
    }
}

/// One entry of a forwarding chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hop {
    /// An IP address (canonical).
    Addr(IpAddr),
    /// Something else: `unknown`, an obfuscated name, a malformed entry.
    Opaque,
}

/// Optional whitespace (RFC 9110).
const OWS: [char; 2] = [' ', '\t'];

/// Calls `visit` with the entries of the chain in `header` (`Forwarded` or
/// `X-Forwarded-For`) from right to left — the last line first — until it breaks. Empty list
/// elements are skipped, as RFC 9110 requires.
///
/// The walk is lazy where it can be, so that whatever a client wrote at the left of a long
/// header is usually never parsed.
pub(super) fn walk_chain<B>(
    headers: &HeaderMap,
    header: ForwardingHeader,
    mut visit: impl FnMut(Hop) -> ControlFlow<B>,
) -> ControlFlow<B> {
    for line in headers.get_all(header.name()).iter().rev() {
        // Bytes that are not UTF-8 become U+FFFD, which no address contains: the entries
        // holding them are opaque, the others still parse.
        let text = String::from_utf8_lossy(line.as_bytes());
        if header == ForwardingHeader::Forwarded {
            // Split from the left (a quoted string opens there), walked from the right.
            let elements: SmallVec<[Option<&str>; INLINE_ELEMENTS]> =
                split_unquoted(&text, ',').collect();
            for element in elements.into_iter().rev() {
                match element {
                    // An unclosed quoted string swallows the rest of the line, so this
                    // element may contain text of several writers: opaque.
                    None => visit(Hop::Opaque)?,
                    Some(e) if e.trim_matches(OWS).is_empty() => {}
                    Some(e) => visit(forwarded_hop(e))?,
                }
            }
        } else {
            for entry in text.rsplit(',') {
                let entry = entry.trim_matches(OWS);
                if !entry.is_empty() {
                    visit(parse_node(entry))?;
                }
            }
        }
    }
    ControlFlow::Continue(())
}

/// The address in `X-Real-IP`: one line holding one address, else nothing.
pub(super) fn real_ip(headers: &HeaderMap) -> Option<IpAddr> {
    let mut lines = headers.get_all(ForwardingHeader::XRealIp.name()).iter();
    let (Some(line), None) = (lines.next(), lines.next()) else {
        // Absent, or repeated: a repeated line means one was not overwritten by the proxy.
        return None;
    };
    let text = String::from_utf8_lossy(line.as_bytes());
    match parse_node(text.trim_matches(OWS)) {
        Hop::Addr(ip) => Some(ip),
        Hop::Opaque => None,
    }
}

/// The parts of `text` between each `sep` outside quoted strings (RFC 9110
/// `quoted-string`, with `\` escapes), from the left. A part in which a quoted string is
/// still open at the end of `text` is `None`.
fn split_unquoted(text: &str, sep: char) -> SplitUnquoted<'_> {
    SplitUnquoted {
        text,
        sep,
        start: Some(0),
    }
}

/// The iterator of [`split_unquoted`].
struct SplitUnquoted<'a> {
    text: &'a str,
    sep: char,
    /// Where the next part starts; `None` once the last was given.
    start: Option<usize>,
}

impl<'a> Iterator for SplitUnquoted<'a> {
    type Item = Option<&'a str>;

    fn next(&mut self) -> Option<Option<&'a str>> {
        let start = self.start?;
        let rest = self.text.get(start..).unwrap_or_default();
        let mut in_quote = false;
        let mut escaped = false;
        for (i, c) in rest.char_indices() {
            if in_quote {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_quote = false;
                }
            } else if c == '"' {
                in_quote = true;
            } else if c == self.sep {
                self.start = Some(start + i + c.len_utf8());
                // `i` is a char boundary, so `get` always succeeds; if it did not, the part
                // would be opaque.
                return Some(rest.get(..i));
            }
        }
        self.start = None;
        Some((!in_quote).then_some(rest))
    }
}

/// The hop one `Forwarded` element names in its `for` parameter (RFC 7239 §4-6). Parameter
/// names are case-insensitive; an element without `for`, with `for` twice, or with a pair
/// that is not `name=value` is opaque.
fn forwarded_hop(element: &str) -> Hop {
    let mut node = None;
    for pair in split_unquoted(element, ';') {
        // The element's quotes are balanced, so no pair can be unclosed.
        let Some(pair) = pair else { return Hop::Opaque };
        let pair = pair.trim_matches(OWS);
        if pair.is_empty() {
            continue;
        }
        let Some((name, value)) = pair.split_once('=') else {
            return Hop::Opaque;
        };
        if !name.trim_matches(OWS).eq_ignore_ascii_case("for") {
            continue;
        }
        if node.is_some() {
            return Hop::Opaque;
        }
        node = Some(value.trim_matches(OWS));
    }
    match node.and_then(unquote) {
        Some(node) => parse_node(&node),
        None => Hop::Opaque,
    }
}

/// The content of a parameter value: a token as is, a quoted string unescaped (borrowed when
/// it has no escapes, as a quoted IPv6 node has none). `None` when it is neither (a stray
/// quote or backslash, text after the closing quote).
fn unquote(value: &str) -> Option<Cow<'_, str>> {
    let Some(inner) = value.strip_prefix('"') else {
        return (!value.contains(['"', '\\'])).then_some(Cow::Borrowed(value));
    };
    if let Some(plain) = inner.strip_suffix('"').filter(|p| !p.contains(['"', '\\'])) {
        return Some(Cow::Borrowed(plain));
    }
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return chars.as_str().is_empty().then_some(Cow::Owned(out)),
            c => out.push(c),
        }
    }
    None
}

/// A node (RFC 7239 §6; the same forms appear in `X-Forwarded-For`): `192.0.2.1`,
/// `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`, with an optional
/// numeric or obfuscated (`_name`) port. Anything else — `unknown`, `_hidden`, an IPv6 zone —
/// is opaque. An unbracketed IPv6 address is never read as having a port.
fn parse_node(text: &str) -> Hop {
    node_addr(text).map_or(Hop::Opaque, |ip| Hop::Addr(ip.to_canonical()))
}

fn node_addr(text: &str) -> Option<IpAddr> {
    if let Some(rest) = text.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !after.is_empty() && !is_port(after.strip_prefix(':')?) {
            return None;
        }
        return addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (addr, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    addr.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// `1*5DIGIT`, or an obfuscated port `_` followed by letters, digits, `.`, `_`, `-`.
fn is_port(text: &str) -> bool {
    let numeric = (1..=5).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    let obfuscated = text.strip_prefix('_').is_some_and(|name| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    numeric || obfuscated
}
