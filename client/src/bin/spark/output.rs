//! Writing to the terminal without panicking: stdout errors are returned (a closed pipe
//! ends the program quietly), stderr errors are ignored (there is nowhere left to say).

use std::{
    borrow::Cow,
    io::{self, IsTerminal, Write},
};

pub fn stdout_is_tty() -> bool {
    io::stdout().is_terminal()
}

/// Generated text made safe for a terminal: control characters other than newline and
/// tab (escape sequences could recolour, retitle or rewrite the screen) become `�`.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if text.chars().any(unsafe_char) {
        Cow::Owned(
            text.chars()
                .map(|c| if unsafe_char(c) { '\u{fffd}' } else { c })
                .collect(),
        )
    } else {
        Cow::Borrowed(text)
    }
}

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

/// Streamed text on stderr, dimmed when stderr is a terminal (a thinking model's
/// reasoning: stdout keeps only the answer), best effort.
pub fn err_dim_text(text: &str) {
    if stderr_is_tty() {
        err_text(&format!("\x1b[2m{}\x1b[0m", terminal_safe(text)));
    } else {
        err_text(text);
    }
}

/// Text on stderr without a newline (prompts, the spinner), best effort.
pub fn err_text(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_safe_replaces_control_characters_only() {
        assert!(matches!(terminal_safe("plain\ttext\n"), Cow::Borrowed(_)));
        assert_eq!(
            terminal_safe("a\x1b[31mred\x07\r"),
            "a\u{fffd}[31mred\u{fffd}\u{fffd}"
        );
        assert_eq!(terminal_safe("\u{9b}x é"), "\u{fffd}x é");
    }
}
