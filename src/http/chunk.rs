//! The short byte strings of a response the middlewares write themselves — a `RateLimit` or
//! `Retry-After` value, the text of a refusal — written straight into a per-thread chunk and
//! cut from it, so that none takes an allocation of its own.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

/// The longest string cut from a chunk (three `RateLimit` items with partition keys take
/// about 160 bytes; a refusal's text under 100).
pub(crate) const MAX_BYTES: usize = 320;

/// The size of the per-thread chunks.
const CHUNK_BYTES: usize = 4096;

thread_local! {
    static CHUNK: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// The bytes `write` writes (at most `max`, itself at most [`MAX_BYTES`]; `None` when it gives
/// up or writes more), written straight into the thread's chunk and cut from it
/// (`BytesMut::split`, which counts a reference to the chunk): they take no allocation of
/// their own, and are copied nowhere before they are sent. A chunk with less than
/// [`MAX_BYTES`] left is replaced — once every few dozen responses — and freed when the last
/// string cut from it is dropped (servers drop a response once it is sent). On a thread being
/// torn down, or while a string is being written already, a buffer of its own.
pub(crate) fn cut(max: usize, write: impl FnOnce(&mut BytesMut) -> Option<()>) -> Option<Bytes> {
    let max = max.min(MAX_BYTES);
    let mut write = Some(write);
    let shared = CHUNK.try_with(|chunk| {
        let mut chunk = chunk.try_borrow_mut().ok()?;
        if chunk.capacity() < MAX_BYTES {
            *chunk = BytesMut::with_capacity(CHUNK_BYTES);
        }
        let done = write.take().and_then(|write| write(&mut chunk));
        if done.is_none() || chunk.len() > max {
            chunk.clear();
            return Some(None);
        }
        Some(Some(chunk.split().freeze()))
    });
    match shared {
        Ok(Some(bytes)) => bytes,
        _ => {
            let mut own = BytesMut::new();
            write.take()?(&mut own)?;
            (own.len() <= max).then(|| own.freeze())
        }
    }
}

/// A response's text, as `write` writes it: cut from the thread's chunk when it fits in
/// [`MAX_BYTES`], else in a buffer of its own; `None` when `write` gives up.
pub(crate) fn text(write: impl Fn(&mut BytesMut) -> Option<()>) -> Option<Bytes> {
    cut(MAX_BYTES, &write).or_else(|| {
        let mut own = BytesMut::new();
        write(&mut own)?;
        Some(own.freeze())
    })
}

/// Appends the decimal digits of `n`, two at a time from a table.
pub(crate) fn push_u64(out: &mut BytesMut, mut n: u64) {
    if n < 10 {
        out.extend_from_slice(&[b'0' + n as u8]);
        return;
    }
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        start -= 2;
        digits[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        start -= 2;
        digits[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        start -= 1;
        digits[start] = b'0' + n as u8;
    }
    out.extend_from_slice(&digits[start..]);
}

/// "00" to "99", two digits at a time.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";
