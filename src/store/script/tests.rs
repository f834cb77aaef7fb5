use super::*;
use crate::Policy;

const RENEW_LUA: &str = include_str!("../../../lua/renew.lua");

fn limits(policy: &str) -> Vec<Limit> {
    policy.parse::<Policy>().unwrap().limits().to_vec()
}

/// Every algorithm, once, in its Lua file, its Rust twin and a sample limit.
fn algorithms() -> [(&'static str, &'static str, &'static str); 8] {
    [
        (
            "10/s log",
            SLIDING_LOG,
            include_str!("../../algorithm/sliding_log.rs"),
        ),
        (
            "10/s sliding",
            SLIDING_WINDOW,
            include_str!("../../algorithm/sliding_window.rs"),
        ),
        (
            "10/s",
            ROLLING_WINDOW,
            include_str!("../../algorithm/rolling_window.rs"),
        ),
        (
            "1551/s",
            ROLLING_WINDOW_WIDE,
            include_str!("../../algorithm/rolling_window.rs"),
        ),
        (
            "10/s fixed",
            FIXED_WINDOW,
            include_str!("../../algorithm/fixed_window.rs"),
        ),
        ("10/s gcra", GCRA, include_str!("../../algorithm/gcra.rs")),
        (
            "10/s bucket capacity=20",
            GCRA,
            include_str!("../../algorithm/gcra.rs"),
        ),
        (
            "3 concurrent",
            CONCURRENCY,
            include_str!("../../algorithm/concurrency.rs"),
        ),
    ]
}

/// The section names of a Lua file, in order.
fn section_names(file: &str) -> Vec<&str> {
    file.lines()
        .filter_map(|l| l.strip_prefix("--@ "))
        .collect()
}

/// The `pub(crate) fn` names of a Rust file, in order.
fn fn_names(file: &str) -> Vec<&str> {
    file.lines()
        .filter_map(|l| l.strip_prefix("pub(crate) fn "))
        .map(|l| &l[..l.find(['(', '<']).unwrap()])
        .collect()
}

/// Each fragment file has the sections the generator assembles, in the order they run, and
/// its Rust twin the functions of the same names in the same order.
#[test]
fn fragments_mirror_their_twins() {
    for (policy, lua, rust) in algorithms() {
        let limit = limits(policy)[0];
        // the automaton's code picks this file
        assert_eq!(fragments(&limit), lua, "{policy}");
        let packed = algorithm::is_packed(&limit);
        let sections = section_names(lua);
        let expected: &[&str] = if packed {
            &[
                "fields", "prepare", "fresh", "evaluate", "commit", "expires", "refund",
            ]
        } else {
            &["prepare", "evaluate", "commit", "report", "refund"]
        };
        assert_eq!(sections, expected, "{policy}");
        assert!(
            lua.contains("Rust twin: src/algorithm/"),
            "{policy}: the header names the twin"
        );
        assert!(
            section(lua, "refund").contains("Twin: `refund`"),
            "{policy}: the refund fragment names its twin"
        );

        let fns = fn_names(rust);
        let twin: &[&str] = if packed {
            &[
                "load",
                "evaluate",
                "commit",
                "report",
                "expires_at",
                "refund",
            ]
        } else {
            &["evaluate", "commit", "report", "expires_at", "refund"]
        };
        let at: Vec<usize> = twin
            .iter()
            .map(|f| fns.iter().position(|g| g == f).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{policy}: {fns:?}");
    }
    assert_eq!(
        section_names(DRIVER),
        [
            "head",
            "read_one",
            "read_many",
            "id_open",
            "unpack",
            "fresh_pack",
            "stored",
            "pack_open",
            "pack_close",
            "ttl",
            "stored_close",
            "id_close",
            "phase2",
            "write",
            "reply",
            "reply_only",
            "reply_open",
            "reply_packed",
            "tail"
        ]
    );
    assert_eq!(section_names(PRELUDE), ["clock"]);
}

/// The names the generated script gives a limit's fields (`c1`, `t4`), its per-check values
/// (`s1`, `cu4`) and an identifier's states (`got2`, `put2`, `ttl2`) never meet.
#[test]
fn generated_names_never_meet() {
    let mut fields = Vec::new();
    let mut prefixes = vec!["got", "put", "ttl"];
    for (policy, lua, _) in algorithms() {
        fields.extend(fields_of(&limits(policy)[0]));
        let prepare = section(lua, "prepare");
        for decl in prepare.split("local ").skip(1) {
            for name in decl.split(['=', '\n']).next().unwrap().split(',') {
                if let Some(prefix) = name.trim().strip_suffix("$x") {
                    prefixes.push(prefix);
                }
            }
        }
    }
    assert!(prefixes.len() > 8, "{prefixes:?}");
    for f in &fields {
        assert!(!prefixes.contains(f), "{f} is a field and a value");
    }
}

fn fields_of(limit: &Limit) -> Vec<&'static str> {
    fields(limit).map(|(name, _)| name).collect()
}

/// The fields a fragment packs are the ones its twin loads, in the same order, each with a
/// format the client decodes.
#[test]
fn packed_fields_match_the_twins() {
    for (policy, _, _) in algorithms() {
        let limit = limits(policy)[0];
        if !algorithm::is_packed(&limit) {
            assert_eq!(fields(&limit).count(), 0, "{policy}");
            continue;
        }
        let lua: Vec<&str> = fields(&limit).map(|(name, _)| name).collect();
        assert_eq!(lua, Counter::fields(&limit), "{policy}");
        assert!(fields(&limit).all(|(_, w)| w.is_some()), "{policy}");
    }
}

/// The reference policy's script for an IP and a user: the numbers written in, one read for
/// both identifiers and one write each, nothing dispatched, parsed or looped over at run
/// time.
#[test]
fn the_reference_policy_makes_a_straight_script() {
    let sliding = "10/s sliding, 120/min sliding, 240/h sliding";
    let (text, layout, packed, wire) = generate(&limits(sliding), 2);
    assert_eq!(layout.keys_per_id(), 1);
    assert_eq!(packed, [0, 1, 2]);
    assert_eq!(wire.len(), 7);
    assert!(!text.contains('$'), "a placeholder is left:\n{text}");
    assert!(text.contains("local got1, got2 = unpack(redis.call('MGET', KEYS[1], KEYS[2]))"));
    assert!(text.contains("local T, c1, p1, c2, p2, c3, p3 = 0, 0, 0, 0, 0, 0, 0"));
    assert!(text.contains("struct.unpack('<dI4I4I4I4I4I4', got2)"));
    assert!(text.contains("local s3 = now - now % 3600000000"));
    assert!(text.contains("(c2 + cost) > 120 then"));
    // the second identifier takes the first one's new state when it had the same state
    assert!(text.contains("elseif got2 == got1 then"));
    // TIME, MGET, then per identifier PSETEX, or SET keeping the TTL
    assert_eq!(text.matches("redis.call(").count(), 6);
    assert!(text.contains("redis.call('PSETEX', KEYS[2], ttl2, put2)"));
    assert!(text.contains("redis.call('SET', KEYS[2], put2, 'KEEPTTL')"));
    for absent in [
        "ARGV[3]", "ARGV[4]", "cjson", "function", "HSET", "EXPIRE", "for j", "while m",
    ] {
        assert!(!text.contains(absent), "{absent}");
    }
    assert!(text.trim_end().ends_with(
        "return (ok and '1' or '0') .. sec .. ',' .. usec .. ';' .. (got1 or '\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0') .. (got2 or '\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0')"
    ));
    // a fresh identifier skips the evaluation: charged once, it admits up to 10
    assert!(text.contains("elseif not got1 and cost <= 10 then"));

    // one identifier: one GET, and a fresh state charged without evaluating it
    let (one, ..) = generate(&limits(sliding), 1);
    assert!(one.contains("local got1 = redis.call('GET', KEYS[1])"));
    assert!(one.contains("elseif not got1 and cost <= 10 then"));
    assert!(!one.contains("MGET"));
}

/// The reference policy with the default algorithm, the rolling window: five counters per
/// limit, the sub-window written in, the ring moved on without a loop, the same one read and
/// one write per identifier.
#[test]
fn the_reference_policy_with_the_rolling_window() {
    let (text, layout, packed, wire) = generate(&limits("10/s, 120/min, 240/h"), 2);
    assert_eq!(layout.keys_per_id(), 1);
    assert_eq!(packed, [0, 1, 2]);
    // T, then each limit's ring in one number: 8 + 3 × 8 bytes
    assert_eq!(wire.len(), 4);
    assert_eq!(wire.iter().map(|w| w.len()).sum::<usize>(), 32);
    assert!(!text.contains('$'), "a placeholder is left:\n{text}");
    assert!(text.contains("T, ring1, ring2, ring3 = struct.unpack('<dddd', got2)"));
    // 1 h in quarters
    assert!(text.contains("local s3 = now - now % 900000000"));
    assert!(text.contains("local life3 = s3 + 3600000000 + 900000000"));
    // 120/min: base 1552 (as every count), the sum modulo 1551
    assert!(text.contains("if ring2 % 1551 + cost > 120 then"));
    // 10/s, moved on by two sub-windows: modulo 1552^3, times 1552^2
    assert!(text.contains("ring1 = ring1 % 3738308608 * 2408704"));

    // a count too large for one number: five counters
    let (wide, _, _, wire) = generate(&limits("2000/s, 120/min"), 1);
    assert_eq!(wire.len(), 1 + 5 + 1);
    assert!(wide.contains("if ra1 + rb1 + rc1 + rd1 + re1 + cost > 2000 then"));
    assert!(wide.contains("ra1, rb1, rc1, rd1, re1 = 0, 0, ra1, rb1, rc1"));
    assert_eq!(text.matches("redis.call(").count(), 6);
    for absent in ["function", "cjson"] {
        assert!(!text.contains(absent), "{absent}");
    }
    // no loop at run time
    let lines = || text.lines().map(str::trim_start);
    assert!(!lines().any(|l| l.starts_with("for ") || l.starts_with("while ")));
}

/// Every algorithm, and all of them in one policy, generate complete scripts for one and for
/// several identifiers; sorted sets get keys of their own after the packed key.
#[test]
fn every_shape_fills_every_placeholder() {
    let all = "10/s sliding, 5/s log, 20/min fixed, 2 concurrent, 7/3s gcra burst=2, 4/s bucket";
    for policy in algorithms().map(|a| a.0).into_iter().chain([all]) {
        for ids in [1, 2, 16] {
            let (text, layout, ..) = generate(&limits(policy), ids);
            assert!(!text.contains('$'), "{policy}: a placeholder is left");
            assert!(text.starts_with(section(PRELUDE, "clock")));
            let sorted = layout.keys_per_id() > usize::from(layout.has_packed());
            let end = if sorted { "return head" } else { "')" };
            assert!(text.trim_end().ends_with(end), "{policy}");
            let reads = text.contains("redis.call('MGET'") || text.contains("redis.call('GET'");
            assert_eq!(reads, layout.has_packed(), "{policy}");
            // phase 1, phase 2, and the reply when it goes through each identifier
            let passes = if sorted { 3 } else { 2 };
            assert_eq!(text.matches("-- identifier ").count(), passes * ids);
        }
    }
    let (text, layout, packed, wire) = generate(&limits(all), 2);
    assert_eq!(layout.keys_per_id(), 3);
    assert_eq!(packed, [0, 2, 4, 5]);
    // T, c p, c, t r, t r
    assert_eq!(wire.len(), 8);
    assert!(text.contains("local got1, got2 = unpack(redis.call('MGET', KEYS[1], KEYS[4]))"));
    assert!(text.contains("local j, base = 2, 3"));
    assert!(text.contains("redis.call('ZRANGE', KEYS[base + 2], '-1', '-1')"));
    assert!(text.contains("redis.call('ZADD', KEYS[base + 3], string.format('%d', now + "));
    // 7/3s: T = 3e6/7 µs = 428571 + 3/7; burst 2 → 857142 + 6/7
    assert!(text.contains("cu5, cr5 = cost * 428571 + kq, kr - kq * 7"));
    assert!(text.contains("t5 - now > 857142 or (t5 - now == 857142 and r5 > 6)"));
}

/// One script per policy and number of identifiers, generated once: the same finds the same
/// script, another policy (even of the same shape) or count gets its own.
#[test]
fn scripts_are_cached_per_policy() {
    let a = check_script(&limits("11/s, 13/min"), 2);
    let b = check_script(&limits("11/s, 13/min"), 2);
    assert!(Arc::ptr_eq(&a, &b));
    let c = check_script(&limits("11/s, 14/min"), 2);
    assert_ne!(a.script.get_hash(), c.script.get_hash());
    let d = check_script(&limits("11/s fixed, 13/min"), 2);
    assert_ne!(a.script.get_hash(), d.script.get_hash());
    let e = check_script(&limits("11/s, 13/min"), 3);
    assert_ne!(a.script.get_hash(), e.script.get_hash());
}

/// The driver reads ARGV, and builds its reply, the way this module lays them out.
#[test]
fn wire_layout_matches_the_driver() {
    let head = section(DRIVER, "head");
    let clock = section(PRELUDE, "clock");
    assert!(clock.contains("local now, sec, usec, realtime = ARGV[2], nil, nil, true"));
    assert!(clock.contains("if not now or now == '' then"));
    assert!(head.contains("local cost = tonumber(ARGV[1])"));
    assert!(section(CONCURRENCY, "commit").contains("ARGV[3]"));
    assert_eq!(now_arg(None), "");
    assert_eq!(now_arg(Some(7)), "7");

    // one string: verdict, time, ";", per identifier its packed state and 4 doubles per
    // sorted set
    assert!(section(DRIVER, "reply_open")
        .contains("local head = (ok and '1' or '0') .. sec .. ',' .. usec .. ';'"));
    assert!(section(DRIVER, "reply_only")
        .contains("return (ok and '1' or '0') .. sec .. ',' .. usec .. ';' .. $replies"));
    assert!(clock.contains("sec, usec = t[1], t[2]"));
    assert!(clock.contains("sec, usec, realtime = '0', now, false"));
    assert!(section(DRIVER, "reply_packed").contains("head = head .. (got$j or '$zero')"));
    // a sorted set's record: what it read, as text (see `record`)
    assert!(section(CONCURRENCY, "report").contains("head = head .. L$x[j]"));
    assert!(section(CONCURRENCY, "evaluate").contains("L$x[j] = used .. ',;'"));
    assert!(section(SLIDING_LOG, "report").contains("head = head .. L$x[j]"));
    assert!(section(SLIDING_LOG, "evaluate").contains("record = used .. ',,' .. newest .. ';'"));
    // the packed state is T, then the fields; T is the time of the last charge
    assert!(section(DRIVER, "stored").contains("local T, $fields = 0, $zeros"));
    assert!(section(RENEW_LUA, "renew").contains("local lease = tonumber(ARGV[1])"));
    assert!(section(DRIVER, "pack_close").contains("struct.pack('$format', T, $fields)"));
}

/// Little-endian bytes as Lua's `struct.pack` writes them for `wire`.
fn pack(wire: &[Wire], values: &[u64]) -> Vec<u8> {
    wire.iter()
        .zip(values)
        .flat_map(|(w, v)| match w {
            Wire::Double => (*v as f64).to_le_bytes().to_vec(),
            Wire::U32 => (*v as u32).to_le_bytes().to_vec(),
        })
        .collect()
}

/// A check of cost 1 of `ids` under `limits`, without a namespace or a lease.
fn one_check<'a>(ids: &'a [String], limits: &'a [Limit]) -> Plan<'a> {
    Plan {
        ids,
        namespace: None,
        limits,
        cost: 1,
        lease: "",
    }
}

/// A reply is read through the twin: the packed state gives every figure, the sorted sets'
/// entries are taken as the script reported them, and the verdicts must agree.
#[test]
fn replies_are_derived_with_the_twin() {
    let l = limits("2/s sliding, 5/s log");
    let compiled = check_script(&l, 1);
    let now = 1_767_225_600_250_000u64;
    let ids = vec!["a".to_string()];
    let plan = one_check(&ids, &l);
    // one request earlier in this second: T, c, p
    let state = pack(&compiled.wire, &[now - 100_000, 1, 0]);
    let reply = |allowed: &str, state: &[u8], entry: &str| {
        let mut head = format!("{allowed}1767225600,250000;").into_bytes();
        head.extend_from_slice(state);
        head.extend_from_slice(entry.as_bytes());
        Value::BulkString(head)
    };
    // the log as the script read it: one live entry, 0.1 s ago; charged one more
    let log = "1,,1767225600150000-1;";
    let out = parse_reply(reply("1", &state, log), &compiled, &plan, 0).unwrap();
    assert!(out.allowed);
    assert_eq!(out.entries[0].remaining, 0);
    assert_eq!(out.entries[0].reset_after_us, 1_750_000);
    assert_eq!(out.entries[1].remaining, 3);

    // a fresh identifier: all zeros
    let fresh = vec![0; state.len()];
    let out = parse_reply(reply("1", &fresh, log), &compiled, &plan, 0).unwrap();
    assert_eq!(out.entries[0].remaining, 1);

    // the script and the twin disagree: an error, not a guess
    assert!(parse_reply(reply("0", &state, log), &compiled, &plan, 0).is_err());
    // a state of the wrong size, a negative or fractional figure, a bad time, not a string
    assert!(parse_reply(reply("1", &state[1..], log), &compiled, &plan, 0).is_err());
    let negative = "-3,,1767225600150000-1;";
    assert!(parse_reply(reply("1", &state, negative), &compiled, &plan, 0).is_err());
    let fraction = "3.5,,1767225600150000-1;";
    assert!(parse_reply(reply("1", &state, fraction), &compiled, &plan, 0).is_err());
    // a record cut short, or followed by more
    assert!(parse_reply(
        reply("1", &state, "1,,1767225600150000-1"),
        &compiled,
        &plan,
        0
    )
    .is_err());
    let longer = "1,,1767225600150000-1;0";
    assert!(parse_reply(reply("1", &state, longer), &compiled, &plan, 0).is_err());
    assert!(parse_reply(Value::BulkString(b"1x;".to_vec()), &compiled, &plan, 0).is_err());
    assert!(parse_reply(Value::Int(1), &compiled, &plan, 0).is_err());

    // without sorted sets the reply is the string alone
    let l = limits("2/s sliding");
    let compiled = check_script(&l, 1);
    let plan = Plan { limits: &l, ..plan };
    let mut head = b"10,1767225600250000;".to_vec();
    head.extend_from_slice(&state);
    let out = parse_reply(Value::BulkString(head), &compiled, &plan, 0).unwrap();
    assert_eq!(out.entries[0].remaining, 0);
    assert_eq!(stamp(b"1767225600,5").unwrap(), 1_767_225_600_000_005);
    assert!(stamp(b"17,x").is_err() && stamp(b"17").is_err());
    // a waiting check's time and wait; a time, or a wait that would carry the time, past
    // 2^53 µs (what the scripts' doubles hold exactly, and the twin's arithmetic takes) is a
    // reply of the wrong kind, not a time
    assert_eq!(stamp_and_wait(b"17,5,40").unwrap(), (17_000_005, 40));
    assert_eq!(stamp_and_wait(b"17,5").unwrap(), (17_000_005, 0));
    let past = format!("17,5,{}", (1u64 << 53) - 17_000_004);
    assert!(stamp_and_wait(past.as_bytes()).is_err());
    let last = format!("17,5,{}", (1u64 << 53) - 17_000_005);
    assert_eq!(
        stamp_and_wait(last.as_bytes()).unwrap().1,
        (1u64 << 53) - 17_000_005
    );
    let wrapping = format!("17,5,{}", u64::MAX - 17_000_005);
    assert!(stamp_and_wait(wrapping.as_bytes()).is_err());
    assert_eq!(stamp(b"9007199254,740992").unwrap(), 1 << 53);
    assert!(stamp(b"9007199254,740993").is_err());
    assert!(stamp(b"18446744073709,551615").is_err());
}

/// A reply whose figures the twin cannot work with is an error, not figures that mean
/// nothing: a GCRA remainder of n-ths of a µs that is n or more (a key written by something
/// else), a time past 2^53 µs, a wait longer than the check may wait.
#[test]
fn replies_the_twin_cannot_work_with_are_errors() {
    let l = limits("10/s gcra");
    let compiled = check_script(&l, 1);
    let ids = vec!["a".to_string()];
    let plan = one_check(&ids, &l);
    let now = 1_767_225_600_250_000u64;
    let reply = |head: &str, state: &[u8]| {
        let mut bytes = head.as_bytes().to_vec();
        bytes.extend_from_slice(state);
        Value::BulkString(bytes)
    };
    // an arrival time just ahead of now, with a remainder in range: read, and denied by
    // both the script and the twin
    let ahead = now + 999_999;
    let fine = pack(&compiled.wire, &[now - 1, ahead, 9]);
    assert!(
        !parse_reply(reply("01767225600,250000;", &fine), &compiled, &plan, 0)
            .unwrap()
            .allowed
    );
    // the same with a remainder of the count or more: its figures would wrap
    for r in [10, 1_000_000_000] {
        let foreign = pack(&compiled.wire, &[now - 1, ahead, r]);
        let error =
            parse_reply(reply("01767225600,250000;", &foreign), &compiled, &plan, 0).unwrap_err();
        assert!(error.to_string().contains("GCRA remainder"), "{error}");
    }
    // a time past 2^53 µs
    let fresh = vec![0; fine.len()];
    let late = parse_reply(
        reply("118446744073709,551615;", &fresh),
        &compiled,
        &plan,
        0,
    );
    assert!(late.is_err());
    // a check that may wait 1 s told to wait longer, or a check that may not wait told to:
    // an error, not a sleep of that long
    let wait = |wait: u64, max: u64| {
        let head = format!("11767225600,250000,{wait};");
        parse_reply(reply(&head, &fresh), &compiled, &plan, max)
    };
    assert_eq!(wait(1_000_000, 1_000_000).unwrap().wait_us, 1_000_000);
    assert!(wait(1_000_001, 1_000_000).is_err());
    assert!(wait(1_000_000_000_000, 1_000_000).is_err());
    assert!(wait(1, 0).is_err());
}

#[test]
fn sections_are_read_to_the_next_marker() {
    let file = "-- header\n--@ one\na\nb\n--@ two\nc\n";
    assert_eq!(section(file, "one"), "a\nb\n");
    assert_eq!(section(file, "two"), "c\n");
    assert_eq!(section(file, "three"), "");
    let mut out = String::new();
    fill(
        &mut out,
        "x$a y$bb $c$a.",
        &[("a", "1".into()), ("bb", "2".into())],
    );
    assert_eq!(out, "x1 y2 $c1.");
}

#[test]
fn the_renew_script_is_the_prelude_and_renew_lua() {
    assert!(RENEW.starts_with(PRELUDE));
    assert!(RENEW.ends_with(RENEW_LUA));
    // the renew script reads the clock the same way
    assert!(RENEW.contains(section(PRELUDE, "clock")));
}

mod refund;
/// The script of a check that may wait fills every placeholder, for every algorithm but a
/// concurrency limit (which cannot reserve), and leaves the ordinary script as it was.
#[test]
fn the_reserving_form_fills_every_placeholder() {
    let shapes = [
        "5/s log",
        "5/s",
        "5/s fixed",
        "5/s gcra burst=2",
        "5/s, 9/min log, 7/h fixed, 3/s bucket",
        "5/s sliding",
        "2000/s",
        "2000/s, 5/s",
    ];
    for policy in shapes {
        for ids in [1, 3] {
            let (text, ..) = generate_within(&limits(policy), ids, true);
            assert!(!text.contains('$'), "{policy}: a placeholder is left");
            assert!(text.contains("for pass = 1, 3 do"), "{policy}");
            assert!(text.contains("local reserve, real = tonumber(ARGV[3]), now"));
            // a rolling window says when it admits, in its form's terms, once per identifier
            let mut rolling = 0;
            for (l, limit) in limits(policy).iter().enumerate() {
                if limit.algorithm() != Algorithm::RollingWindow {
                    continue;
                }
                rolling += 1;
                let x = l + 1;
                assert!(text.contains(&format!("if e > s{x} or ")), "{policy}");
                let form = match rolling_window::base(limit) {
                    Some(_) => format!("elseif ring{x} % "),
                    None => format!("elseif ra{x} + rb{x} + "),
                };
                assert!(text.contains(&form), "{policy}: {form}");
            }
            assert_eq!(
                text.matches("if at > tstar").count(),
                rolling * ids,
                "{policy}"
            );
            let (plain, ..) = generate(&limits(policy), ids);
            assert!(!plain.contains("for pass"), "{policy}");
            assert!(!plain.contains("real -"), "{policy}");
            assert!(!plain.contains("ARGV[3]"), "{policy}");
        }
    }
}
