//! llama.cpp tensor names and layouts ↔ Hugging Face ones.
//!
//! | GGUF                          | Hugging Face                                      |
//! |-------------------------------|---------------------------------------------------|
//! | `token_embd.weight`           | `model.embed_tokens.weight`                       |
//! | `blk.N.attn_norm.weight`      | `model.layers.N.input_layernorm.weight`           |
//! | `blk.N.attn_{q,k,v}.*`        | `model.layers.N.self_attn.{q,k,v}_proj.*`         |
//! | `blk.N.attn_output.*`         | `model.layers.N.self_attn.o_proj.*`               |
//! | `blk.N.attn_{q,k}_norm.weight`| `model.layers.N.self_attn.{q,k}_norm.weight` (Qwen3) |
//! | `blk.N.ffn_norm.weight`       | `model.layers.N.post_attention_layernorm.weight`  |
//! | `blk.N.ffn_{gate,up,down}`    | `model.layers.N.mlp.{gate,up,down}_proj.weight`   |
//! | `output_norm.weight`          | `model.norm.weight`                               |
//! | `output.weight`               | `lm_head.weight` (absent: tied to embeddings)     |
//!
//! GGUF dims are stored innermost first; candle reverses them, so shapes are `[out, in]`.
//!
//! Values are Hugging Face's except llama's q/k: `convert_hf_to_gguf.py`'s `LlamaModel`
//! reorders each head's rows from `rotate_half` order (first half, second half) to
//! llama.cpp's interleaved pairs; its `Qwen2Model` and `Qwen3Model` do not.
use anyhow::{bail, Result};
use candle_core::Tensor;

use crate::model::{ArchConfig, Family};

/// The llama.cpp name of a Hugging Face tensor name of any supported family (None: not a
/// decoder tensor).
pub fn gguf_tensor_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
}

/// The head count the converter permuted a tensor's rows with (None: stored as is):
/// llama's q (query heads) and k (key/value heads), weight and bias.
pub fn permuted_heads(cfg: &ArchConfig, hf: &str) -> Option<usize> {
    if cfg.family != Family::Llama {
        return None;
    }
    let module = hf.rsplit_once('.')?.0;
    if module.ends_with("self_attn.q_proj") {
        Some(cfg.num_attention_heads)
    } else if module.ends_with("self_attn.k_proj") {
        Some(cfg.num_key_value_heads)
    } else {
        None
    }
}

/// [`unpermute_qk`] as a row order: row `i` of the Hugging Face tensor is row `perm[i]`
/// of the file's (`out` rows over `heads` heads). A quantized tensor's rows are whole
/// blocks, so this undoes the permutation without touching a block.
pub fn unpermute_rows(out: usize, heads: usize) -> Result<Vec<usize>> {
    if heads == 0 || !out.is_multiple_of(heads * 2) {
        bail!("cannot un-permute {out} rows over {heads} heads");
    }
    let half = out / heads / 2;
    Ok((0..out)
        .map(|r| {
            let (h, t, j) = (r / (2 * half), r % (2 * half) / half, r % half);
            h * 2 * half + j * 2 + t
        })
        .collect())
}

/// Undo `LlamaModel.permute`: the converter viewed each head's `hd` rows as `(2, hd/2)`
/// and swapped the axes, so the file holds them as `(hd/2, 2)`; swapping back restores
/// Hugging Face's order. `t` is `[heads * hd, in]` (weight) or `[heads * hd]` (bias).
pub fn unpermute_qk(t: &Tensor, heads: usize) -> Result<Tensor> {
    let out = t.dims().first().copied().unwrap_or(0);
    if heads == 0 || !out.is_multiple_of(heads * 2) {
        bail!(
            "cannot un-permute a tensor of shape {:?} over {heads} heads",
            t.dims()
        );
    }
    let half = out / heads / 2;
    let t = match *t.dims() {
        [_, inp] => t
            .reshape((heads, half, 2, inp))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((out, inp))?,
        [_] => t
            .reshape((heads, half, 2))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape(out)?,
        _ => bail!("cannot un-permute a tensor of shape {:?}", t.dims()),
    };
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_rows_is_unpermute_qk() {
        for (out, heads) in [(8, 2), (24, 3), (64, 4)] {
            let t = Tensor::arange(0u32, out as u32, &candle_core::Device::Cpu).unwrap();
            let want: Vec<u32> = unpermute_qk(&t, heads).unwrap().to_vec1().unwrap();
            let got: Vec<u32> = unpermute_rows(out, heads)
                .unwrap()
                .iter()
                .map(|&r| r as u32)
                .collect();
            assert_eq!(got, want);
        }
        assert!(unpermute_rows(6, 4).is_err());
    }
    use candle_core::Device;

    #[test]
    fn gguf_names_cover_every_tensor_of_every_family() {
        for family in Family::ALL {
            let cfg = ArchConfig {
                family,
                tie_word_embeddings: false,
                attention_bias: true,
                ..ArchConfig::tiny()
            };
            let mut seen = std::collections::HashSet::new();
            for (hf, _) in cfg.tensor_shapes() {
                let g = gguf_tensor_name(&hf).unwrap_or_else(|| panic!("no GGUF name for {hf}"));
                assert!(seen.insert(g.clone()), "duplicate GGUF name {g}");
            }
        }
        let cases = [
            (
                "model.layers.3.self_attn.o_proj.weight",
                "blk.3.attn_output.weight",
            ),
            ("model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias"),
            (
                "model.layers.1.post_attention_layernorm.weight",
                "blk.1.ffn_norm.weight",
            ),
            (
                "model.layers.2.self_attn.q_norm.weight",
                "blk.2.attn_q_norm.weight",
            ),
            (
                "model.layers.2.self_attn.k_norm.weight",
                "blk.2.attn_k_norm.weight",
            ),
        ];
        for (hf, g) in cases {
            assert_eq!(gguf_tensor_name(hf).as_deref(), Some(g), "{hf}");
        }
        assert_eq!(gguf_tensor_name("model.layers.x.mlp.up_proj.weight"), None);
    }

    /// The converter's forward permutation, written as it is in Python.
    fn permute(t: &Tensor, heads: usize) -> Tensor {
        let out = t.dims()[0];
        let half = out / heads / 2;
        match *t.dims() {
            [_, inp] => t.reshape((heads, 2, half, inp)).unwrap(),
            _ => t.reshape((heads, 2, half)).unwrap(),
        }
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(t.dims())
        .unwrap()
    }

    #[test]
    fn unpermute_inverts_the_converter_and_moves_rows_by_hand() {
        // One head of 4 rows: HF (r0 r1 | r2 r3) is stored interleaved as r0 r2 r1 r3.
        let hf = Tensor::arange(0f32, 8., &Device::Cpu)
            .unwrap()
            .reshape((4, 2))
            .unwrap();
        let stored = permute(&hf, 1);
        let rows: Vec<Vec<f32>> = stored.to_vec2().unwrap();
        assert_eq!(rows, [[0., 1.], [4., 5.], [2., 3.], [6., 7.]]);
        for (heads, out, inp) in [(1, 4, 2), (4, 32, 6), (2, 16, 3)] {
            let w = Tensor::randn(0f32, 1., (out, inp), &Device::Cpu).unwrap();
            let back = unpermute_qk(&permute(&w, heads), heads).unwrap();
            assert_eq!(back.to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
            let b = Tensor::randn(0f32, 1., out, &Device::Cpu).unwrap();
            let back = unpermute_qk(&permute(&b, heads), heads).unwrap();
            assert_eq!(back.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        }
        let odd = Tensor::zeros((6, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(unpermute_qk(&odd, 2).is_err());
    }

    #[test]
    fn only_llama_q_and_k_are_permuted() {
        let llama = ArchConfig {
            family: Family::Llama,
            attention_bias: true,
            ..ArchConfig::tiny()
        };
        let heads = |cfg: &ArchConfig, hf: &str| permuted_heads(cfg, hf);
        assert_eq!(
            heads(&llama, "model.layers.0.self_attn.q_proj.weight"),
            Some(4)
        );
        assert_eq!(
            heads(&llama, "model.layers.1.self_attn.k_proj.bias"),
            Some(2)
        );
        assert_eq!(
            heads(&llama, "model.layers.0.self_attn.v_proj.weight"),
            None
        );
        assert_eq!(
            heads(&llama, "model.layers.0.self_attn.o_proj.weight"),
            None
        );
        for family in [Family::Qwen2, Family::Qwen3] {
            let cfg = ArchConfig {
                family,
                ..ArchConfig::tiny()
            };
            assert_eq!(heads(&cfg, "model.layers.0.self_attn.q_proj.weight"), None);
        }
    }
}
