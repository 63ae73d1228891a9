//! The `sluice` command: parses arguments and hands off to the library.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
