//! The identifiers of one request, as the HTTP layer collects them: a short one (an IP key) is
//! written in place, without allocating; any other is the `String` its extractor returned.
//! One identifier — the usual case — takes no collection either.

use std::fmt;

use arrayvec::ArrayString;

/// The most bytes an identifier written in place holds: `ip:` and the longest IPv6 network
/// (`ffff:…:ffff/128`, 43 bytes) with room to spare.
const INLINE: usize = 62;

/// Text of at most `N` bytes, in place (an identifier). Kept as a `str` (an `ArrayString`),
/// only ever appended whole `str`s: reading it is free, where bytes kept as bytes would be
/// checked to be UTF-8 again at each reading (a check of every identifier for each limiter,
/// partition key and store key it goes into).
#[derive(Clone)]
pub(crate) struct InlineText<const N: usize = INLINE>(ArrayString<N>);

impl<const N: usize> InlineText<N> {
    pub(crate) const fn new() -> InlineText<N> {
        InlineText(ArrayString::new_const())
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// Appends the first `keep` bytes of `text`, ASCII: the whole of `text` is copied (a copy
    /// of a length known where this is inlined, cheaper than one of a length known only
    /// when it runs), then the text is cut back.
    #[inline]
    pub(crate) fn push_cut(&mut self, text: &str, keep: usize) -> fmt::Result {
        debug_assert!(text.is_ascii() && keep <= text.len());
        let end = self.0.len() + keep.min(text.len());
        self.0.try_push_str(text).map_err(|_| fmt::Error)?;
        // ASCII: every length is a character boundary.
        self.0.truncate(end);
        Ok(())
    }
}

impl<const N: usize> fmt::Write for InlineText<N> {
    /// Appends `s`, or fails (leaving the text as it was) when it does not fit.
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.try_push_str(s).map_err(|_| fmt::Error)
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
