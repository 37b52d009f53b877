//! Every command the docs show in a block marked `sh tested` runs as shown (issue 56,
//! item 5): the blocks of README.md and docs/*.md, docs/quickstart.md first (the others
//! use its run), each line run by `sh` in a scratch directory that sees the repository's
//! inputs (`configs/`, `examples/`, `tests/fixtures/`, ...) but not its `runs/`, with
//! `cargo run --release --` standing for the binary under test. A line ending in `&` is a
//! server: it must answer `GET /health` on its `--port` within a minute, and is stopped
//! (SIGTERM, a clean exit) at the end of its block. A command that no longer works fails
//! here, naming its page and line. Offline: the tiny model is built in place.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MARK: &str = "```sh tested";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The command of one shell line: a trailing `# comment` outside quotes removed.
fn command_of(line: &str) -> &str {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].trim(),
            _ => {}
        }
        prev = c;
    }
    line.trim()
}

/// The `sh tested` blocks of a page: their commands with line numbers.
fn tested_blocks(page: &Path) -> Vec<Vec<(usize, String)>> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut block: Option<Vec<(usize, String)>> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match block.as_mut() {
            Some(_) if line.trim_start().starts_with("```") => out.extend(block.take()),
            Some(b) => {
                let cmd = command_of(line);
                if !cmd.is_empty() {
                    b.push((i + 1, cmd.to_string()));
                }
            }
            None if line.trim_end() == MARK => block = Some(Vec::new()),
            None => {}
        }
    }
    assert!(
        block.is_none(),
        "{}: a `sh tested` block is not closed",
        page.display()
    );
    out
}

/// README.md and docs/*.md, the quickstart first.
fn pages() -> Vec<PathBuf> {
    let docs = repo().join("docs");
    let mut rest: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter(|p| !p.ends_with("quickstart.md"))
        .collect();
    rest.sort();
    let mut pages = vec![docs.join("quickstart.md"), repo().join("README.md")];
    pages.extend(rest);
    pages
}

/// A scratch directory whose entries link to the repository's, without `runs/` and
/// build or model folders, so the commands write only here.
fn scratch() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if [".git", "target", "runs", ".models"].contains(&name.to_str().unwrap_or("")) {
            continue;
        }
        std::os::unix::fs::symlink(e.path(), d.path().join(&name)).unwrap();
    }
    d
}

/// The shell command for `cmd`, with the binary under test for `cargo run --release --`
/// (`exec`, so that a server is the process the test stops).
fn shell(dir: &Path, at: &str, cmd: &str) -> Command {
    let bin = env!("CARGO_BIN_EXE_concord");
    let line = match cmd.strip_prefix("cargo run --release --") {
        Some(args) => format!("exec '{bin}'{args}"),
        None => panic!("{at}: `{cmd}` does not start with `cargo run --release --`"),
    };
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(line)
        .current_dir(dir)
        .env("HF_HUB_OFFLINE", "1");
    c
}

fn run(dir: &Path, at: &str, cmd: &str) {
    let out = shell(dir, at, cmd).output().unwrap();
    assert!(
        out.status.success(),
        "{at}: `{cmd}` failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `--port` of a server command (the server's default otherwise).
fn port_of(cmd: &str) -> u16 {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == "--port")
        .map_or(8000, |w| w[1].parse().unwrap())
}

fn healthy(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let mut reply = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut reply).is_ok()
        && reply.starts_with("HTTP/1.1 200")
}

fn start_server(dir: &Path, at: &str, cmd: &str) -> Child {
    let cmd = cmd.trim_end_matches('&').trim();
    let mut child = shell(dir, at, cmd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !healthy(port_of(cmd)) {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{at}: `{cmd}` exited ({status}) before it answered /health");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{at}: `{cmd}` never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    child
}

fn stop_server(at: &str, mut child: Child) {
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{at}: the server's exit on SIGTERM: {status}"
    );
}

#[test]
fn a_comment_is_cut_outside_quotes_only() {
    assert_eq!(command_of("concord a --b 1   # why"), "concord a --b 1");
    assert_eq!(
        command_of("concord s --c '{\"a\": \"#1\"}'"),
        "concord s --c '{\"a\": \"#1\"}'"
    );
    assert_eq!(command_of("concord x#y"), "concord x#y");
    assert_eq!(command_of("   # only a comment"), "");
}

#[test]
fn every_tested_command_in_the_docs_runs() {
    let dir = scratch();
    let mut ran = Vec::new();
    for page in pages() {
        let name = page.strip_prefix(repo()).unwrap().display().to_string();
        for block in tested_blocks(&page) {
            let mut servers = Vec::new();
            for (line, cmd) in block {
                let at = format!("{name}:{line}");
                eprintln!("{at}: {cmd}");
                if cmd.ends_with('&') {
                    servers.push((at.clone(), start_server(dir.path(), &at, &cmd)));
                } else {
                    run(dir.path(), &at, &cmd);
                }
                ran.push(cmd);
            }
            for (at, child) in servers {
                stop_server(&at, child);
            }
        }
    }
    // The blocks are there to be run: the quickstart and the commands issue 56 names.
    for needle in [
        "train --config configs/quickstart.toml",
        "eval --config configs/quickstart.toml --compare",
        "plot runs/quickstart",
        "generate ",
        "score ",
        "export runs/quickstart",
        "serve ",
    ] {
        assert!(
            ran.iter().any(|c| c.contains(needle)),
            "no tested `{needle}`"
        );
    }
}
