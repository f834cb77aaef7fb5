//! How the examples end on an error: its message and the chain of its causes, as a person
//! reads them (a store error names its fix), rather than `main`'s debug print of the value.

use std::error::Error;
use std::process::ExitCode;

/// Prints `e` and its causes to standard error, and returns the exit code of a failure.
pub fn failure(e: &dyn Error) -> ExitCode {
    eprintln!("error: {e}");
    let mut source = e.source();
    while let Some(cause) = source {
        eprintln!("  caused by: {cause}");
        source = cause.source();
    }
    ExitCode::FAILURE
}
