//! The committed references are what the code generates: `docs/cli.md` from the clap
//! definitions, `docs/configuration.md` from the config schema's doc comments. A flag
//! or a key added without regenerating them fails here. `CONCORD_BLESS=1` rewrites
//! them instead.
use std::path::Path;

#[test]
fn the_cli_reference_is_current() {
    use concord::cli::docs::{cli_markdown, REGENERATE};
    check("docs/cli.md", &cli_markdown(), REGENERATE);
}

#[test]
fn the_configuration_reference_is_current() {
    use concord::config::reference::{markdown, REGENERATE};
    check("docs/configuration.md", &markdown().unwrap(), REGENERATE);
}

fn check(page: &str, generated: &str, regenerate: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
    if std::env::var("CONCORD_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        panic!(
            "{page} differs from what the code generates ({}).\nRegenerate it: \
             `{regenerate}` (or `CONCORD_BLESS=1 cargo test --test tests docs::`), and \
             commit it.",
            first_difference(&committed, generated)
        );
    }
}

/// Where two texts part, as a reader finds it: the line and both versions of it.
fn first_difference(committed: &str, generated: &str) -> String {
    let (mut a, mut b) = (committed.lines(), generated.lines());
    for n in 1.. {
        match (a.next(), b.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => break,
            (x, y) => {
                return format!(
                    "line {n}: committed {:?}, generated {:?}",
                    x.unwrap_or("<end>"),
                    y.unwrap_or("<end>")
                )
            }
        }
    }
    "they differ in line endings only".into()
}
