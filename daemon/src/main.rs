//! `sparkd`: the daemon binary. Everything of substance lives in the library.

fn main() -> anyhow::Result<()> {
    Ok(())
}
