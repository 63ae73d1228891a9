//! What the commands print on stdout. `println!` panics when the reader has gone away
//! (`sluice task list | head`); these return the error instead, so it travels up like any
//! other and `main` ends quietly, after every destructor has run (a bench's child server is
//! stopped, not orphaned).

use std::io::Write;

/// Writes one line to stdout.
pub fn line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")
}

/// Whether `error` is stdout's reader having gone away, which is no failure of the command.
pub fn is_closed_stdout(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that returns `std::io::Result<()>` instead of panicking.
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
        let closed = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("print the summary");
        assert!(is_closed_stdout(&closed));
        let full = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert!(!is_closed_stdout(&full));
        assert!(!is_closed_stdout(&anyhow::anyhow!("no such task")));
    }
}
