//! [`Renderer`]: the one text interface over a model's vocabulary, and its
//! implementations (a real [`Tokenizer`], ids as text for tests, a bare decoder).
use super::Tokenizer;
use crate::chat::Message;
use anyhow::Result;

/// Chat messages to prompt tokens, completion tokens to text, and the stop tokens.
pub trait Renderer {
    /// Chat template with the generation prompt, and its token ids.
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)>;
    /// Text of `ids`, special tokens included.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Tokens that end a completion.
    fn stop_ids(&self) -> Vec<u32>;
    /// Token ids of plain text (no special tokens, no template): a completion as the
    /// model would write it. Only a real tokenizer can.
    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        anyhow::bail!("this renderer cannot encode text ({} bytes)", text.len())
    }
    /// The token ids of one environment turn of a multi-turn conversation, rendered on
    /// its own so that they can be appended to the ids so far (never re-rendered from
    /// text): the rest of the chat template's assistant turn after the model's answer
    /// (without the stop token `ended_with` the model already wrote), a user turn holding
    /// `content`, and the generation prompt. Only a chat template can.
    fn render_env_turn(&self, content: &str, ended_with: Option<u32>) -> Result<Vec<u32>> {
        let _ = ended_with;
        anyhow::bail!(
            "this renderer has no chat template for environment turns ({} bytes)",
            content.len()
        )
    }
}

impl Renderer for Tokenizer {
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        let text = self.apply_chat_template(messages, true)?;
        let ids = self.encode(&text)?;
        Ok((text, ids))
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Tokenizer::decode(self, ids)
    }
    fn stop_ids(&self) -> Vec<u32> {
        self.stop_token_ids().to_vec()
    }
    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text)
    }
    fn render_env_turn(&self, content: &str, ended_with: Option<u32>) -> Result<Vec<u32>> {
        self.encode(&self.env_turn_text(content, ended_with)?)
    }
}

/// A renderer without a tokenizer: text is the ids, no stop tokens (tests, toy tasks,
/// `random:` models).
pub struct IdRenderer;

impl Renderer for IdRenderer {
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        anyhow::bail!("IdRenderer cannot render {} chat messages", messages.len())
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(" "))
    }
    fn stop_ids(&self) -> Vec<u32> {
        Vec::new()
    }
    /// The inverse of `decode`: whitespace-separated ids.
    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        text.split_whitespace()
            .map(|t| {
                t.parse::<u32>()
                    .map_err(|_| anyhow::anyhow!("IdRenderer cannot encode `{t}`: not a token id"))
            })
            .collect()
    }
}

/// A bare decoder (a closure) is a renderer that cannot render chats and has no stop
/// tokens.
impl<F: Fn(&[u32]) -> Result<String>> Renderer for F {
    fn render(&self, messages: &[Message]) -> Result<(String, Vec<u32>)> {
        anyhow::bail!(
            "a bare decoder cannot render {} chat messages",
            messages.len()
        )
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        self(ids)
    }
    fn stop_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}
