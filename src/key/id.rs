//! The identifiers of one request, as the HTTP layer collects them: a short one (an IP key) is
//! written in place, without allocating; any other is the `String` its extractor returned.
//! One identifier — the usual case — takes no collection either.

use std::fmt;

/// The most bytes an identifier written in place holds: `ip:` and the longest IPv6 network
/// (`ffff:…:ffff/128`, 43 bytes) with room to spare.
const INLINE: usize = 62;

/// Text of at most `N` bytes, in place (an identifier; a header value being written).
#[derive(Clone)]
pub(crate) struct InlineText<const N: usize = INLINE> {
    len: usize,
    bytes: [u8; N],
}

impl<const N: usize> InlineText<N> {
    pub(crate) const fn new() -> InlineText<N> {
        InlineText {
            len: 0,
            bytes: [0; N],
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only whole `&str`s are ever appended, so the bytes are always UTF-8.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Appends the decimal digits of `n`.
    pub(crate) fn write_u64(&mut self, mut n: u64) -> fmt::Result {
        let mut digits = [b'0'; 20];
        let mut start = digits.len();
        while n >= 100 {
            let pair = usize::try_from(n % 100).unwrap_or_default() * 2;
            n /= 100;
            start -= 2;
            digits[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = usize::try_from(n).unwrap_or_default() * 2;
            start -= 2;
            digits[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            start -= 1;
            digits[start] = b'0' + n as u8;
        }
        self.push_ascii(&digits[start..])
    }

    /// Appends `bytes`, ASCII (so the text stays UTF-8).
    pub(crate) fn push_ascii(&mut self, bytes: &[u8]) -> fmt::Result {
        debug_assert!(bytes.is_ascii());
        let end = self.len + bytes.len();
        let Some(room) = self.bytes.get_mut(self.len..end) else {
            return Err(fmt::Error);
        };
        room.copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

/// "00" to "99", two digits at a time.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

impl<const N: usize> fmt::Write for InlineText<N> {
    /// Appends `s`, or fails (leaving the text as it was) when it does not fit.
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let Some(room) = self.bytes.get_mut(self.len..end) else {
            return Err(fmt::Error);
        };
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// One identifier of a request.
#[derive(Clone)]
pub(crate) enum Identifier {
    /// Written in place.
    Inline(InlineText),
    /// As an extractor returned it.
    Owned(String),
}

impl AsRef<str> for Identifier {
    fn as_ref(&self) -> &str {
        match self {
            Identifier::Inline(text) => text.as_str(),
            Identifier::Owned(text) => text,
        }
    }
}

impl fmt::Debug for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_ref(), f)
    }
}

/// The identifiers of one request, in the order found; one is held without a vector.
#[derive(Clone, Debug, Default)]
pub(crate) enum Identifiers {
    #[default]
    None,
    One(Identifier),
    Many(Vec<Identifier>),
}

impl Identifiers {
    pub(crate) fn push(&mut self, id: Identifier) {
        *self = match std::mem::take(self) {
            Identifiers::None => Identifiers::One(id),
            Identifiers::One(first) => Identifiers::Many(vec![first, id]),
            Identifiers::Many(mut all) => {
                all.push(id);
                Identifiers::Many(all)
            }
        };
    }

    /// Adds `id`, if there is one.
    pub(crate) fn extend(&mut self, id: Option<Identifier>) {
        if let Some(id) = id {
            self.push(id);
        }
    }

    pub(crate) fn as_slice(&self) -> &[Identifier] {
        match self {
            Identifiers::None => &[],
            Identifiers::One(id) => std::slice::from_ref(id),
            Identifiers::Many(all) => all,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::{Identifier, Identifiers, InlineText, INLINE};

    #[test]
    fn inline_text_holds_what_fits_and_refuses_the_rest() {
        let mut text = InlineText::<INLINE>::new();
        assert_eq!(text.as_str(), "");
        let address = "203.0.113.9";
        write!(text, "ip:{address}").unwrap();
        assert_eq!(text.as_str(), "ip:203.0.113.9");
        let long = "x".repeat(INLINE);
        assert!(text.write_str(&long).is_err());
        assert_eq!(text.as_str(), "ip:203.0.113.9");
        let mut full = InlineText::<INLINE>::new();
        full.write_str(&long).unwrap();
        assert_eq!(full.as_str(), long);
        assert!(full.write_str("y").is_err());
    }

    #[test]
    fn numbers_are_their_display() {
        let mut numbers = vec![u64::MAX, 999_999_999_999_999, 1 << 53];
        numbers.extend(0..=1_000);
        numbers.extend((1..20).map(|k| 10u64.pow(k)));
        numbers.extend((1..20).map(|k| 10u64.pow(k) - 1));
        numbers.extend((1..20).map(|k| 10u64.pow(k) + 7));
        for n in numbers {
            let mut text = InlineText::<20>::new();
            text.write_u64(n).unwrap();
            assert_eq!(text.as_str(), n.to_string());
        }
        let mut short = InlineText::<2>::new();
        assert!(short.write_u64(100).is_err());
        assert_eq!(short.as_str(), "");
    }

    #[test]
    fn identifiers_keep_their_order() {
        let mut ids = Identifiers::default();
        assert!(ids.is_empty());
        let mut inline = InlineText::<INLINE>::new();
        inline.write_str("ip:192.0.2.1").unwrap();
        ids.push(Identifier::Inline(inline));
        assert!(matches!(ids, Identifiers::One(_)));
        ids.push(Identifier::Owned("user:42".into()));
        ids.push(Identifier::Owned("header:x:1".into()));
        let texts: Vec<&str> = ids.as_slice().iter().map(AsRef::as_ref).collect();
        assert_eq!(texts, ["ip:192.0.2.1", "user:42", "header:x:1"]);
    }
}
