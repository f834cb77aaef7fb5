//! `Serialize` and `Deserialize` for [`Policy`] and [`Limit`], as their text
//! (`"10/s, 120/min"`, `"100/s bucket capacity=500"`), with the `serde` feature.
//!
//! A policy in a file reads as it does in code; an invalid one fails with the message its
//! `FromStr` gives, naming the bad part.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use super::{Limit, Policy};

impl Serialize for Policy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Policy, D::Error> {
        d.deserialize_str(FromText(
            PhantomData,
            "a rate-limit policy such as \"10/s, 120/min\"",
        ))
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Limit, D::Error> {
        d.deserialize_str(FromText(PhantomData, "a rate limit such as \"10/s\""))
    }
}

/// Reads a `T` from its text.
struct FromText<T>(PhantomData<T>, &'static str);

impl<T> de::Visitor<'_> for FromText<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Limit, Policy};

    #[derive(Debug, serde::Deserialize, serde::Serialize, PartialEq)]
    struct File {
        policy: Policy,
        limit: Limit,
    }

    #[test]
    fn policies_are_their_text() {
        let file: File =
            toml::from_str("policy = \"10/s, 120/min\"\nlimit = \"100/s bucket capacity=500\"\n")
                .unwrap();
        assert_eq!(file.policy, "10/s, 120/min".parse().unwrap());
        assert_eq!(file.limit, "100/s bucket capacity=500".parse().unwrap());
        let text = toml::to_string(&file).unwrap();
        assert_eq!(
            text,
            "policy = \"10/s, 120/min\"\nlimit = \"100/s bucket capacity=500\"\n"
        );
        assert_eq!(toml::from_str::<File>(&text).unwrap(), file);
    }

    #[test]
    fn an_invalid_policy_names_its_bad_part() {
        let err = toml::from_str::<File>("policy = \"5/fortnight\"\nlimit = \"1/s\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("fortnight"), "{err}");
    }
}
