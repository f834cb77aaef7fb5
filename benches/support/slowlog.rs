//! The arguments of the last `EVALSHA` a Redis server logged in its `SLOWLOG`: how the cost
//! bench and the allocation test capture the exact call a check sent.

/// In `log` (the reply of `SLOWLOG GET`, newest first), the arguments of the newest `EVALSHA`:
/// the command, the hash, the key count, the keys and the arguments, as text.
pub fn newest_evalsha(log: &[Vec<redis::Value>]) -> Option<Vec<String>> {
    log.iter()
        .filter_map(|entry| match entry.get(3) {
            Some(redis::Value::Array(a)) => Some(a),
            _ => None,
        })
        .map(|a| {
            a.iter()
                .map(|v| redis::from_redis_value_ref::<String>(v).unwrap_or_default())
                .collect::<Vec<String>>()
        })
        .find(|a| a.first().is_some_and(|c| c.eq_ignore_ascii_case("evalsha")))
}
