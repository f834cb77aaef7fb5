//! A script call built once, straight into the command that is sent.
//!
//! `redis::ScriptInvocation` keeps each key and argument in a buffer of its own and copies
//! them into an `EVALSHA` command at every attempt. A check knows how many keys it sends
//! before it writes the first, so [`Call`] writes `EVALSHA`, the script's hash, the key count,
//! the keys and the arguments into one command, sized once: a check allocates no more than
//! the `redis` crate needs to send any command. Like `invoke_async`, it loads the script and
//! sends the command again only when Redis answers `NOSCRIPT` (which proves the script did not
//! run).

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ScriptInvocation, ToRedisArgs};

/// Where a script's keys and arguments are written: a [`Call`], or a
/// `redis::ScriptInvocation` for the calls that are not on a check's path.
pub(crate) trait ScriptArgs {
    /// Adds a key (all keys come before the first argument).
    fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self;
    /// Adds an argument.
    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self;
}

impl ScriptArgs for ScriptInvocation<'_> {
    fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        ScriptInvocation::key(self, key)
    }

    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        ScriptInvocation::arg(self, arg)
    }
}

/// An `EVALSHA` of a script with a known number of keys.
pub(crate) struct Call<'a> {
    script: &'a Script,
    cmd: Cmd,
    /// The number of keys the command declares.
    declared: usize,
    /// The keys written so far.
    keys: usize,
    /// Whether an argument was written: a key after it would be taken for an argument.
    args: bool,
}

impl<'a> Call<'a> {
    /// A call of `script` with `keys` keys; about `bytes` bytes of keys and arguments.
    pub(crate) fn new(script: &'a Script, keys: usize, bytes: usize) -> Call<'a> {
        let mut cmd = Cmd::with_capacity(keys + 8, bytes + 64);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Call {
            script,
            cmd,
            declared: keys,
            keys: 0,
            args: false,
        }
    }

    /// Sends the call; on `NOSCRIPT`, loads the script and sends it once more.
    ///
    /// # Errors
    ///
    /// The connection's and the server's errors, and a client error when the call's keys do
    /// not match the count it declared (a bug: the command is not sent).
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        con: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        if self.keys != self.declared {
            return Err((
                ErrorKind::Client,
                "a script call's keys do not match its key count",
            )
                .into());
        }
        match self.cmd.query_async(con).await {
            Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let _: String = self.script.prepare_invoke().load_async(con).await?;
                self.cmd.query_async(con).await
            }
            other => other,
        }
    }
}

impl ScriptArgs for Call<'_> {
    fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        if self.args {
            // out of order: the count no longer matches, and the call is refused
            self.keys = usize::MAX;
        } else {
            self.keys += 1;
        }
        self.cmd.arg(key);
        self
    }

    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args = true;
        self.cmd.arg(arg);
        self
    }
}
