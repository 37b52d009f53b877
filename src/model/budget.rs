//! Size checks made before allocating: sequence lengths against the model's
//! `max_position_embeddings`, and a memory estimate (KV cache, logits, log-prob rows)
//! against the memory the machine has. A request past either is a clear error that
//! names the flag or key and the numbers, never an allocation abort.
//!
//! # Training memory
//!
//! [`TrainMemory::estimate`] predicts the peak memory of one training forward + backward
//! of our transformer ([`super::transformer`], LoRA from [`super::lora`], the custom ops of
//! [`super::ops`]) before anything is allocated, so that the trainer can cut
//! micro-batches to a budget (`[optim] memory_budget_gb`). It counts what the graph
//! keeps alive until the backward ends. With `H` hidden, `Q = heads x head_dim`,
//! `K = kv_heads x head_dim`, `I` intermediate, `NH` query heads, `L` layers, `V` vocab,
//! `s` bytes per element of the model dtype, and a forward stream of `n` tokens that
//! each attend to `k` keys:
//!
//! - per layer: `n (6H + 5Q + 5K + 3I) s` — the RMSNorm outputs, q/k/v as projected,
//!   made contiguous and rotated, the attention output before and after its transpose,
//!   o_proj, the two residual sums, gate/up/SwiGLU and down_proj — plus
//!   `2 n k NH s` for the attention scores and their softmax (the quadratic term), plus
//!   `4 n D` for LoRA dropout masks (f32, `D` = the summed input widths of the targeted
//!   modules; 0 without dropout);
//! - once: the additive attention mask, `4 n k`;
//! - the log-prob head over the `m` scored positions: the final norm `n H s`, two
//!   `m H s` copies of the scored rows, and the kept softmax `4 m V` when it fits
//!   [`super::ops::PROB_CACHE_BYTES`] (per call, so per shared-prompt group);
//! - on top, the largest short-lived working set (not summed over layers): the biggest
//!   of one layer's attention backward `16 n k NH` (f32), its SwiGLU backward `20 n I`
//!   and one log-prob chunk's logits `12 c V` (`c` = positions per chunk), plus the
//!   residual stream's gradients `16 n H + 8 m H`.
//!
//! A shared-prompt group ([`super::Input::Shared`], `P` prompt
//! tokens, `G` completions of `C` scored tokens) is two streams: the prompt (`n = P`,
//! `k = P`) and the completions (`n = G (C-1)`, `k = P + C - 1`), plus per layer the
//! prompt keys/values broadcast to every row, `2 G (P + C - 1) K s`. The groups of a
//! micro-batch add their held memory; their working sets do not add.
//!
//! With gradient checkpointing only every layer's input is kept, `(L + 1) n H s` per
//! stream, plus one layer's activations while it is recomputed in the backward.
//!
//! The sum is multiplied by [`CALIBRATION`] and [`OVERHEAD_BYTES`] added, both
//! measured against peak RSS (see the constant). Model weights are not part of it: the budget's default is taken from
//! the memory still available once the model is loaded.
use super::lora::{LoraConfig, LORA_TARGETS};
use super::{ArchConfig, Transformer};
use anyhow::{bail, Result};
use candle_core::{DType, Device};

/// Bytes per element of `dtype`.
fn bytes_of(dtype: DType) -> f64 {
    dtype.size_in_bytes() as f64
}

/// Memory the host could still give (MemAvailable) when this process first asked, in
/// bytes; None where unknown. Read once: the allocator keeps what a phase frees for the
/// next one (a warm start's SFT, then GRPO; one step, then the next) and the kernel
/// does not count that memory as available, so a later reading would shrink the
/// budget by the process's own reusable memory.
pub fn available_memory() -> Option<f64> {
    first_limit().map(|m| m.bytes as f64)
}

/// The limit [`available_memory`] read, once.
fn first_limit() -> Option<&'static crate::sys::MemoryLimit> {
    static FIRST: std::sync::OnceLock<Option<crate::sys::MemoryLimit>> = std::sync::OnceLock::new();
    FIRST.get_or_init(crate::sys::memory_limit).as_ref()
}

/// " under RLIMIT_AS" where a limit other than the host's free memory binds.
fn limit_note() -> String {
    match first_limit() {
        Some(m) if m.source != "MemAvailable" => format!(" under the {}", m.source),
        _ => String::new(),
    }
}

fn gib(b: f64) -> String {
    format!("{:.1} GiB", b / (1024.0 * 1024.0 * 1024.0))
}

/// Bytes of the KV cache for `rows` sequences of `len` tokens.
pub fn kv_cache_bytes(cfg: &ArchConfig, rows: usize, len: usize, dtype: DType) -> f64 {
    rows as f64
        * len as f64
        * cfg.num_hidden_layers as f64
        * 2.0
        * cfg.num_key_value_heads as f64
        * cfg.head_dim as f64
        * bytes_of(dtype)
}

/// Fail unless `len` positions fit the model (`what` names the flag or key).
pub fn check_positions(cfg: &ArchConfig, len: usize, what: &str) -> Result<()> {
    if len > cfg.max_position_embeddings {
        bail!(
            "{what}: {len} positions exceed the model's max_position_embeddings ({})",
            cfg.max_position_embeddings
        );
    }
    Ok(())
}

/// Fail when `bytes` (an estimate of `what`) exceeds the host's available memory. Only
/// on the CPU: device memory is not known up front.
pub fn check_memory(bytes: f64, device: &Device, what: &str) -> Result<()> {
    if !device.is_cpu() {
        return Ok(());
    }
    if let Some(avail) = available_memory() {
        if bytes > avail {
            bail!(
                "{what} needs about {} but only {} of memory is available{}; ask for fewer \
                 rows or tokens",
                gib(bytes),
                gib(avail),
                limit_note()
            );
        }
    }
    Ok(())
}

/// Fail, before a byte is read, when the weights of `name` (`bytes` as they will be
/// held) exceed the memory this process can get: the kernel would kill it part way
/// through. Only on the CPU. The error says what would fit.
pub fn check_weights(bytes: f64, device: &Device, name: &str) -> Result<()> {
    if !device.is_cpu() {
        return Ok(());
    }
    if let Some(avail) = available_memory() {
        if bytes > avail {
            bail!(
                "loading {name} needs about {} for its weights but only {} of memory is \
                 available{}; store the base smaller ([model] base_dtype = \"bf16\", \
                 \"q8_0\" or \"q4_k\"; `concord model estimate` says what fits)",
                gib(bytes),
                gib(avail),
                limit_note()
            );
        }
    }
    Ok(())
}

/// Sampling `rows` completions of up to `new_tokens` after prompts of up to
/// `prompt_len` tokens: positions and KV cache + one step's logits per row.
pub fn check_sampling(
    cfg: &ArchConfig,
    device: &Device,
    dtype: DType,
    rows: usize,
    prompt_len: usize,
    new_tokens: usize,
    what: &str,
) -> Result<()> {
    check_positions(cfg, prompt_len.saturating_add(new_tokens), what)?;
    let bytes = kv_cache_bytes(cfg, rows, prompt_len + new_tokens, dtype)
        + rows as f64 * cfg.vocab_size as f64 * 4.0 * 2.0;
    check_memory(bytes, device, what)
}

/// Scoring (or training on) `rows` sequences of `len` tokens in one forward pass:
/// positions, then the logits and log-softmax rows (the largest tensors by far).
pub fn check_scoring(
    cfg: &ArchConfig,
    device: &Device,
    rows: usize,
    len: usize,
    what: &str,
) -> Result<()> {
    check_positions(cfg, len, what)?;
    let bytes = rows as f64 * len as f64 * cfg.vocab_size as f64 * 4.0 * 2.0
        + kv_cache_bytes(cfg, rows, len, DType::F32);
    check_memory(bytes, device, what)
}

/// Bytes in a GB, the unit of `[optim] memory_budget_gb` and of the messages here.
pub const GB: f64 = 1e9;

/// Share of the host's available memory (MemAvailable, read once, at the run's first update)
/// that a training micro-batch may take when `[optim] memory_budget_gb` is unset. The
/// rest is headroom for the allocator, the sampler's next step and other processes.
pub const DEFAULT_BUDGET_SHARE: f64 = 0.7;

/// Measured growth of peak RSS over the formula's bytes, rounded up, plus
/// [`OVERHEAD_BYTES`]. Measured with `concord bench train` (f32, r = 16, 2 cores; growth
/// of peak RSS over the RSS with the model loaded; formula before calibration):
///
/// | shape | B x T | checkpointing | formula | measured |
/// |---|---|---|---|---|
/// | `random:0.5b` | 2 x 256 | off | 2.70 GB | 2.87 GB |
/// | `random:0.5b` | 2 x 256 | on | 1.23 GB | 1.45 GB |
/// | `random:tiny` | 8 x 512 | off | 0.34 GB | 0.57 GB |
/// | `random:tiny` | 8 x 512 | on | 0.25 GB | 0.47 GB |
///
/// The constant gap (about 0.2 GB whatever the size) is allocator slack and per-thread
/// buffers, hence a fixed term; the factor leaves a margin on the rest. The real
/// Qwen2.5-Coder-0.5B GGUF steps in docs/history.md (1 x 4 x 24 and 2 x 8 x 40 tokens on
/// ~700-token prompts, with and without `share_prompt`) come out 5-15% above their
/// measured peaks.
pub const CALIBRATION: f64 = 1.15;

/// Fixed bytes on top of every estimate (see [`CALIBRATION`]).
pub const OVERHEAD_BYTES: f64 = 0.25e9;

/// The shape of one training forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainShape {
    /// `rows` packed sequences of `width` positions each (prompts left-padded,
    /// completions right-padded), of which `scored` per row go through the LM head.
    Packed {
        rows: usize,
        width: usize,
        scored: usize,
    },
    /// One shared-prompt group: a prompt of `prompt` tokens once and `rows`
    /// completions of `completion` scored tokens against it.
    Shared {
        prompt: usize,
        rows: usize,
        completion: usize,
    },
}

/// Estimated bytes of one training forward + backward (before [`CALIBRATION`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryEstimate {
    /// Alive from the forward until the backward ends (the graph's activations).
    pub held: f64,
    /// The largest short-lived working set on top of it.
    pub transient: f64,
}

impl MemoryEstimate {
    /// Predicted peak bytes.
    pub fn bytes(&self) -> f64 {
        (self.held + self.transient) * CALIBRATION + OVERHEAD_BYTES
    }

    /// Two forwards whose graphs are alive together (the groups of one micro-batch):
    /// held memory adds up, working sets do not.
    pub fn and(self, other: MemoryEstimate) -> MemoryEstimate {
        MemoryEstimate {
            held: self.held + other.held,
            transient: self.transient.max(other.transient),
        }
    }
}

/// What the training memory of a model depends on besides the batch's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainMemory {
    cfg: ArchConfig,
    /// Bytes per element of the model dtype.
    elem: f64,
    /// Summed input widths of the LoRA-targeted modules when LoRA dropout is on.
    dropout_in: f64,
    logprob_chunk: usize,
    checkpointing: bool,
    /// Bytes of the LM head's copy in the model dtype when it is stored narrower or
    /// quantized: made by each log-prob call and alive until its backward.
    head_copy: f64,
    /// Bytes of the largest quantized projection dequantized for one GEMM call (prefill,
    /// training forward, backward).
    projection_copy: f64,
}

/// One forward stream: `tokens` query positions attending to `keys` keys each.
struct Stream {
    tokens: f64,
    keys: f64,
}

impl TrainMemory {
    /// The estimator for `model` (its shape, dtype, adapter and log-prob chunk), with
    /// or without gradient checkpointing.
    pub fn new(model: &Transformer, checkpointing: bool) -> Self {
        let (head, projection) = model.base_copies();
        let elem = bytes_of(model.dtype());
        TrainMemory {
            head_copy: head as f64 * elem,
            projection_copy: projection as f64 * elem,
            ..Self::from_config(
                model.config(),
                model.dtype(),
                model.lora_config(),
                model.logprob_chunk,
                checkpointing,
            )
        }
    }

    /// The estimator for a model of shape `cfg` in `dtype` with adapter `lora`, scoring
    /// `logprob_chunk` positions per LM-head chunk.
    pub fn from_config(
        cfg: &ArchConfig,
        dtype: DType,
        lora: Option<&LoraConfig>,
        logprob_chunk: usize,
        checkpointing: bool,
    ) -> Self {
        let h = cfg.hidden_size as f64;
        let q = (cfg.num_attention_heads * cfg.head_dim) as f64;
        let dropout_in = match lora {
            Some(l) if l.dropout > 0.0 => LORA_TARGETS
                .iter()
                .filter(|m| l.targets(m))
                .map(|m| match *m {
                    "o_proj" => q,
                    "down_proj" => cfg.intermediate_size as f64,
                    _ => h,
                })
                .sum(),
            _ => 0.0,
        };
        TrainMemory {
            cfg: cfg.clone(),
            elem: bytes_of(dtype),
            dropout_in,
            logprob_chunk,
            checkpointing,
            head_copy: 0.0,
            projection_copy: 0.0,
        }
    }

    pub fn checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// The same estimator with gradient checkpointing switched to `on`.
    pub fn with_checkpointing(&self, on: bool) -> Self {
        TrainMemory {
            checkpointing: on,
            ..self.clone()
        }
    }

    /// The same estimator counting a frozen base's copies ([`Transformer::base_copies`],
    /// in bytes): the LM head's and the largest dequantized projection's.
    pub fn with_base_copies(mut self, head: f64, projection: f64) -> Self {
        self.head_copy = head;
        self.projection_copy = projection;
        self
    }

    /// Estimated memory of one training forward + backward of `shape`.
    pub fn estimate(&self, shape: TrainShape) -> MemoryEstimate {
        let c = &self.cfg;
        let (s, l) = (self.elem, c.num_hidden_layers as f64);
        let h = c.hidden_size as f64;
        let nh = c.num_attention_heads as f64;
        let q = nh * c.head_dim as f64;
        let k = (c.num_key_value_heads * c.head_dim) as f64;
        let i = c.intermediate_size as f64;
        // Qwen3 keeps its head-normed queries and keys as well.
        let qk_norm = if c.family.qk_norm() { q + k } else { 0.0 };
        let (streams, scored, kv_cat) = match shape {
            TrainShape::Packed {
                rows,
                width,
                scored,
            } => {
                let st = Stream {
                    tokens: (rows * width) as f64,
                    keys: width as f64,
                };
                (vec![st], (rows * scored) as f64, 0.0)
            }
            TrainShape::Shared {
                prompt,
                rows,
                completion,
            } => {
                let cin = completion.saturating_sub(1) as f64;
                let (p, g) = (prompt as f64, rows as f64);
                let mut st = vec![Stream { tokens: p, keys: p }];
                if cin > 0.0 {
                    st.push(Stream {
                        tokens: g * cin,
                        keys: p + cin,
                    });
                }
                (st, g * completion as f64, 2.0 * g * (p + cin) * k * s)
            }
        };
        let tokens: f64 = streams.iter().map(|st| st.tokens).sum();
        // One layer's activations, all streams.
        let layer: f64 = streams
            .iter()
            .map(|st| {
                st.tokens
                    * ((6.0 * h + 5.0 * q + 5.0 * k + 3.0 * i + qk_norm) * s
                        + 4.0 * self.dropout_in)
                    + 2.0 * st.tokens * st.keys * nh * s
            })
            .sum::<f64>()
            + kv_cat;
        let masks: f64 = streams.iter().map(|st| 4.0 * st.tokens * st.keys).sum();
        let layers = if self.checkpointing {
            (l + 1.0) * tokens * h * s + layer
        } else {
            l * layer
        };
        let vocab = c.vocab_size as f64;
        let probs = scored * vocab * 4.0;
        let head = tokens * h * s
            + 2.0 * scored * h * s
            + if probs <= super::ops::PROB_CACHE_BYTES as f64 {
                probs
            } else {
                0.0
            };
        let attn = streams
            .iter()
            .map(|st| 16.0 * st.tokens * st.keys * nh)
            .fold(0.0, f64::max);
        let mlp = streams
            .iter()
            .map(|st| 20.0 * st.tokens * i)
            .fold(0.0, f64::max);
        let chunk = 12.0 * (self.logprob_chunk as f64).min(scored) * vocab;
        MemoryEstimate {
            held: layers + masks + head + self.head_copy,
            transient: attn.max(mlp).max(chunk)
                + 16.0 * tokens * h
                + 8.0 * scored * h
                + self.projection_copy,
        }
    }
}

/// The memory a training micro-batch may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryBudget {
    /// Bytes; infinite when unknown (no split).
    pub bytes: f64,
    pub source: BudgetSource,
}

/// Where a [`MemoryBudget`] came from (for messages).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetSource {
    /// Set by `[optim] memory_budget_gb`.
    Configured,
    /// [`DEFAULT_BUDGET_SHARE`] of this many bytes available on the host, divided
    /// among this many processes of a data-parallel job on the same host.
    Available(f64, usize),
    /// Not set and not known (a GPU, or no `/proc/meminfo`): no limit.
    Unknown,
}

impl Default for MemoryBudget {
    fn default() -> Self {
        MemoryBudget {
            bytes: f64::INFINITY,
            source: BudgetSource::Unknown,
        }
    }
}

/// Processes of this job on this host, from the launcher's environment (Open MPI,
/// MPICH, torchrun, Slurm's first node count); 1 when none says. Each process reads the
/// same available memory, so without dividing it the ranks of one host would each
/// budget for all of it (two ranks of the 0.5B on a 24 GB host were OOM-killed).
pub fn local_processes(var: impl Fn(&str) -> Option<String>) -> usize {
    let keys = [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "LOCAL_WORLD_SIZE",
        "SLURM_NTASKS_PER_NODE",
    ];
    keys.iter()
        .filter_map(|k| var(k))
        .filter_map(|v| {
            // Slurm writes e.g. "2(x3)": 2 tasks on each of 3 nodes.
            let digits: String = v.trim().chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .find(|&n| n >= 1)
        .unwrap_or(1)
}

impl MemoryBudget {
    /// `configured_gb` when set; else on the CPU [`DEFAULT_BUDGET_SHARE`] of the memory
    /// available now; else (other devices, whose free memory is not read) no limit.
    pub fn resolve(configured_gb: Option<f64>, device: &Device) -> Self {
        if let Some(g) = configured_gb {
            return MemoryBudget {
                bytes: g * GB,
                source: BudgetSource::Configured,
            };
        }
        match available_memory() {
            Some(avail) if device.is_cpu() => {
                let n = local_processes(|k| std::env::var(k).ok());
                MemoryBudget {
                    bytes: avail * DEFAULT_BUDGET_SHARE / n as f64,
                    source: BudgetSource::Available(avail, n),
                }
            }
            _ => MemoryBudget::default(),
        }
    }

    /// Whether an estimate of `bytes` fits.
    pub fn fits(&self, bytes: f64) -> bool {
        bytes <= self.bytes
    }

    /// "2.00 GB ([optim] memory_budget_gb)", "14.00 GB (70% of 20.00 GB available)".
    pub fn describe(&self) -> String {
        match self.source {
            BudgetSource::Configured => format!("{} ([optim] memory_budget_gb)", gb(self.bytes)),
            BudgetSource::Available(a, 1) => format!(
                "{} ({:.0}% of {} available{})",
                gb(self.bytes),
                DEFAULT_BUDGET_SHARE * 100.0,
                gb(a),
                limit_note()
            ),
            BudgetSource::Available(a, n) => format!(
                "{} ({:.0}% of {} available{}, shared by {n} processes on this host)",
                gb(self.bytes),
                DEFAULT_BUDGET_SHARE * 100.0,
                gb(a),
                limit_note()
            ),
            BudgetSource::Unknown => {
                "unlimited (memory not known: set [optim] memory_budget_gb)".into()
            }
        }
    }
}

/// A number of bytes in GB (MB below 1 GB), for messages.
pub fn gb(bytes: f64) -> String {
    if bytes >= GB {
        format!("{:.2} GB", bytes / GB)
    } else {
        format!("{:.0} MB", bytes / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_long_and_too_big_are_errors() {
        let c = ArchConfig::tiny();
        let e = check_positions(&c, 5000, "--max-new-tokens").unwrap_err();
        assert!(
            e.to_string().contains("max_position_embeddings (4096)"),
            "{e}"
        );
        assert!(check_positions(&c, 4096, "x").is_ok());
        let e = check_memory(1e30, &Device::Cpu, "sampling").unwrap_err();
        assert!(e.to_string().contains("sampling needs about"), "{e}");
        assert!(check_sampling(&c, &Device::Cpu, DType::F32, 4, 10, 10, "x").is_ok());
    }

    fn qwen05(checkpointing: bool) -> TrainMemory {
        let c = ArchConfig::qwen25_05b();
        let chunk = crate::model::transformer::default_logprob_chunk(c.vocab_size);
        TrainMemory::from_config(
            &c,
            DType::F32,
            Some(&LoraConfig::default()),
            chunk,
            checkpointing,
        )
    }

    #[test]
    fn estimates_follow_the_shapes() {
        let m = qwen05(false);
        let packed = |rows, width, scored| {
            m.estimate(TrainShape::Packed {
                rows,
                width,
                scored,
            })
            .bytes()
        };
        // The workload: 16 rows of ~740 tokens (40 scored) in one micro-batch
        // was OOM-killed at 24 GB; one row alone is about 3 GB.
        let all = packed(16, 740, 40);
        let one = packed(1, 740, 40);
        assert!(all > 24.0 * GB, "{}", gb(all));
        assert!(one > 2.0 * GB && one < 5.0 * GB, "{}", gb(one));
        assert!(packed(2, 740, 40) > one && packed(1, 800, 40) > one);
        // Checkpointing keeps one layer: several times less at this length.
        let ck = qwen05(true).estimate(TrainShape::Packed {
            rows: 16,
            width: 740,
            scored: 40,
        });
        assert!(ck.bytes() * 5.0 < all, "{} vs {}", gb(ck.bytes()), gb(all));
        // A shared 700-token prompt with 8 x 40 completions against 8 packed rows.
        let shared = m
            .estimate(TrainShape::Shared {
                prompt: 700,
                rows: 8,
                completion: 40,
            })
            .bytes();
        assert!(shared * 3.0 < packed(8, 740, 40));
        // Groups of one micro-batch: held memory adds, working sets do not.
        let e = m.estimate(TrainShape::Shared {
            prompt: 700,
            rows: 8,
            completion: 40,
        });
        let both = e.and(e);
        assert_eq!(both.held, 2.0 * e.held);
        assert_eq!(both.transient, e.transient);
    }

    #[test]
    fn qwen3_estimates_hold_its_normed_heads() {
        // Qwen3-0.6B without checkpointing: each layer keeps the head-normed queries and
        // keys too, (16 + 8) x 128 values per token, 28 layers, f32 -- the only
        // difference from the same shape without q/k norms.
        let q3 = ArchConfig::qwen3_06b();
        let no_norm = ArchConfig {
            family: crate::model::Family::Llama,
            rope_scaling: None,
            ..q3.clone()
        };
        let est = |c: &ArchConfig| {
            let chunk = crate::model::transformer::default_logprob_chunk(c.vocab_size);
            TrainMemory::from_config(c, DType::F32, Some(&LoraConfig::default()), chunk, false)
                .estimate(TrainShape::Packed {
                    rows: 2,
                    width: 100,
                    scored: 20,
                })
        };
        let extra = est(&q3).held - est(&no_norm).held;
        assert_eq!(extra, 28.0 * 200.0 * (24.0 * 128.0) * 4.0);
    }

    #[test]
    fn local_processes_come_from_the_launcher() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(local_processes(env(&[])), 1);
        assert_eq!(
            local_processes(env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "2")])),
            2
        );
        assert_eq!(local_processes(env(&[("LOCAL_WORLD_SIZE", "8")])), 8);
        assert_eq!(
            local_processes(env(&[("SLURM_NTASKS_PER_NODE", "4(x3)")])),
            4
        );
        assert_eq!(local_processes(env(&[("MPI_LOCALNRANKS", "0")])), 1);
        assert_eq!(local_processes(env(&[("LOCAL_WORLD_SIZE", "lots")])), 1);
    }

    #[test]
    fn budgets_resolve_and_describe() {
        let b = MemoryBudget::resolve(Some(2.5), &Device::Cpu);
        assert_eq!(b.bytes, 2.5 * GB);
        assert_eq!(b.describe(), "2.50 GB ([optim] memory_budget_gb)");
        assert!(b.fits(2.5 * GB) && !b.fits(2.6 * GB));
        let auto = MemoryBudget::resolve(None, &Device::Cpu);
        if let BudgetSource::Available(a, n) = auto.source {
            assert_eq!(auto.bytes, a * DEFAULT_BUDGET_SHARE / n as f64);
            assert!(auto.describe().contains("70% of"), "{}", auto.describe());
        }
        let shared = MemoryBudget {
            bytes: 7.0 * GB,
            source: BudgetSource::Available(20.0 * GB, 2),
        };
        assert_eq!(
            shared.describe(),
            format!(
                "7.00 GB (70% of 20.00 GB available{}, shared by 2 processes on this host)",
                limit_note()
            )
        );
        assert!(MemoryBudget::default().fits(1e30));
    }
}
