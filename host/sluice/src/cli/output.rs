//! What the commands print on stdout. `println!` panics when the reader has gone away
//! (`sluice task list | head`); these return the error instead, so it travels up like any
//! other and `main` ends quietly, after every destructor has run (a bench's child server is
//! stopped, not orphaned).

use std::io::Write;

/// A failed write to stdout. Its own type, so that a broken pipe here is told apart from one
/// on a socket to the server, which is a failure like any other.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
pub struct StdoutError(#[source] std::io::Error);

/// Writes one line to stdout.
pub fn line(args: std::fmt::Arguments<'_>) -> Result<(), StdoutError> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(StdoutError)
}

/// Whether `error` is stdout's reader having gone away, which is no failure of the command.
pub fn is_closed_stdout(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<StdoutError>()
            .is_some_and(|StdoutError(io)| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that returns `Result<(), StdoutError>` instead of panicking.
macro_rules! outln {
    () => {
        $crate::cli::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::line(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_pipe_counts_as_a_closed_stdout() {
        let broken = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let closed = anyhow::Error::from(StdoutError(broken())).context("print the summary");
        assert!(is_closed_stdout(&closed));
        let full = StdoutError(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert!(!is_closed_stdout(&full.into()));
        // A server that hung up mid-request is a failure, not a reader that has had enough.
        let socket = anyhow::Error::from(broken()).context("send the claim");
        assert!(!is_closed_stdout(&socket));
        assert!(!is_closed_stdout(&anyhow::anyhow!("no such task")));
    }
}
