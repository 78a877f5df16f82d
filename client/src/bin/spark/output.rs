//! Writing to the terminal without panicking: stdout errors are returned (a closed pipe
//! ends the program quietly), stderr errors are ignored (there is nowhere left to say).

use std::io::{self, IsTerminal, Write};

pub fn stderr_is_tty() -> bool {
    io::stderr().is_terminal()
}

/// Writes `text` to stdout and flushes, so streamed tokens appear as they come.
pub fn out(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

pub fn out_line(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.write_all(b"\n")?;
    stdout.flush()
}

/// A line on stderr, best effort.
pub fn error_line(text: &str) {
    let _ = writeln!(io::stderr().lock(), "{text}");
}

/// A line on stderr, dimmed when stderr is a terminal.
pub fn dim_line(text: &str) {
    if stderr_is_tty() {
        error_line(&format!("\x1b[2m{text}\x1b[0m"));
    } else {
        error_line(text);
    }
}

/// Text on stderr without a newline (prompts, the spinner), best effort.
pub fn err_text(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}
