//! Chat messages: the one type the model's chat template, the environments and the
//! servers all speak. A leaf module (it imports nothing from the crate).
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One chat message, as the chat template consumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".into(),
            content: content.into(),
        }
    }
}

/// Read a FILE.json holding a JSON list of `{"role", "content"}` messages.
pub fn read_messages(path: &Path) -> Result<Vec<Message>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let msgs: Vec<Message> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON list of {{\"role\", \"content\"}} messages",
            path.display()
        )
    })?;
    check_messages(&msgs).with_context(|| path.display().to_string())?;
    Ok(msgs)
}

/// Roles a chat template renders.
pub const ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// A conversation a chat template can render: at least one message, every role known
/// (a template silently drops a role it does not know).
pub fn check_messages(msgs: &[Message]) -> Result<()> {
    anyhow::ensure!(
        !msgs.is_empty(),
        "the message list is empty: give at least one {{\"role\", \"content\"}} message"
    );
    for (i, m) in msgs.iter().enumerate() {
        anyhow::ensure!(
            ROLES.contains(&m.role.as_str()),
            "message {}: unknown role `{}` (expected one of {})",
            i + 1,
            m.role,
            ROLES.join(", ")
        );
    }
    Ok(())
}

/// Read a JSONL file with one message list per line (blank lines skipped).
pub fn read_prompts_jsonl(path: &Path) -> Result<Vec<Vec<Message>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let msgs: Vec<Message> = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: expected a JSON list of {{\"role\",\"content\"}}",
                path.display(),
                n + 1
            )
        })?;
        check_messages(&msgs).with_context(|| format!("{} line {}", path.display(), n + 1))?;
        out.push(msgs);
    }
    anyhow::ensure!(!out.is_empty(), "{}: no prompts", path.display());
    Ok(out)
}
