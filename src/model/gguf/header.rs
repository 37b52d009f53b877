//! The GGUF header: read with candle, and when candle stops (it does so at the first
//! problem without naming the tensor), walked again to say what is wrong.
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;

/// ggml type ids candle reads (`GgmlDType`).
const CANDLE_TYPE_IDS: [u32; 15] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// ggml's name of a type id (ggml.h `enum ggml_type`).
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 => "Q4_2 (removed)",
        5 => "Q4_3 (removed)",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("unknown type {id}"),
    };
    name.to_string()
}

#[derive(Debug)]
enum HeaderProblem {
    Truncated(String),
    UnsupportedType { tensor: String, type_id: u32 },
    Other(String),
}

fn diagnose_header<R: Read + Seek>(r: &mut R) -> HeaderProblem {
    match Walker::start(r).and_then(|w| w.walk()) {
        Ok(p) | Err(p) => p,
    }
}

fn eof(what: &str) -> impl Fn(std::io::Error) -> HeaderProblem + '_ {
    move |e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            HeaderProblem::Truncated(format!("the file ends inside the {what}"))
        } else {
            HeaderProblem::Other(format!("reading the {what}: {e}"))
        }
    }
}

/// Size in bytes of a fixed-size metadata value type (None: string, array or unknown).
fn fixed_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// A second pass over the header that only skips, so every bound is checked against the
/// file's length before anything is read.
struct Walker<'a, R> {
    r: &'a mut R,
    len: u64,
    /// GGUF v1 stores lengths and dims as u32.
    v1: bool,
}

impl<'a, R: Read + Seek> Walker<'a, R> {
    /// Checks the magic: `Err(Other)` when this is not a GGUF file at all.
    fn start(r: &'a mut R) -> Result<Self, HeaderProblem> {
        let len = r.seek(SeekFrom::End(0)).map_err(eof("file"))?;
        r.seek(SeekFrom::Start(0)).map_err(eof("file"))?;
        let mut w = Walker { r, len, v1: false };
        let magic = w.u32("magic")?;
        if magic != 0x4655_4747 {
            return Err(HeaderProblem::Other(format!(
                "not a GGUF file (magic 0x{magic:08x})"
            )));
        }
        w.v1 = w.u32("version")? == 1;
        Ok(w)
    }

    fn u32(&mut self, what: &str) -> Result<u32, HeaderProblem> {
        let mut b = [0u8; 4];
        self.r.read_exact(&mut b).map_err(eof(what))?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &str) -> Result<u64, HeaderProblem> {
        let mut b = [0u8; 8];
        self.r.read_exact(&mut b).map_err(eof(what))?;
        Ok(u64::from_le_bytes(b))
    }

    fn length(&mut self, what: &str) -> Result<u64, HeaderProblem> {
        if self.v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<(), HeaderProblem> {
        let pos = self.r.stream_position().map_err(eof(what))?;
        if pos.saturating_add(n) > self.len {
            return Err(HeaderProblem::Truncated(format!(
                "the file ends inside the {what}"
            )));
        }
        self.r
            .seek(SeekFrom::Current(n as i64))
            .map_err(eof(what))?;
        Ok(())
    }

    fn walk(mut self) -> Result<HeaderProblem, HeaderProblem> {
        let n_tensors = self.length("tensor count")?;
        let n_kv = self.length("metadata count")?;
        // The smallest table entry: a tensor's name length, dimension count, type and
        // offset; a metadata key's length, value type and a one-byte value.
        let (tensor_min, kv_min) = if self.v1 { (20, 9) } else { (24, 13) };
        for (n, min, what) in [
            (n_tensors, tensor_min, "tensors"),
            (n_kv, kv_min, "metadata keys"),
        ] {
            if n.saturating_mul(min) > self.len {
                return Err(HeaderProblem::Other(format!(
                    "the header claims {n} {what}, more than a file of {} bytes can list",
                    self.len
                )));
            }
        }
        for _ in 0..n_kv {
            let n = self.length("metadata")?;
            self.skip(n, "metadata")?;
            let t = self.u32("metadata")?;
            self.value(t, 0)?;
        }
        for _ in 0..n_tensors {
            if let Some(p) = self.tensor_entry()? {
                return Ok(p);
            }
        }
        Ok(HeaderProblem::Other(String::new()))
    }

    fn value(&mut self, t: u32, depth: usize) -> Result<(), HeaderProblem> {
        let what = "metadata";
        if let Some(n) = fixed_size(t) {
            return self.skip(n, what);
        }
        match t {
            8 => {
                let n = self.length(what)?;
                self.skip(n, what)
            }
            9 if depth < 64 => {
                let et = self.u32(what)?;
                let n = self.length(what)?;
                if let Some(sz) = fixed_size(et) {
                    return self.skip(n.saturating_mul(sz), what);
                }
                for _ in 0..n {
                    self.value(et, depth + 1)?;
                }
                Ok(())
            }
            _ => Err(HeaderProblem::Other(format!(
                "unknown metadata value type {t}"
            ))),
        }
    }

    /// One tensor table entry; `Some` when its type is one candle cannot read.
    fn tensor_entry(&mut self) -> Result<Option<HeaderProblem>, HeaderProblem> {
        let what = "tensor table";
        let n = self.length(what)?;
        let pos = self.r.stream_position().map_err(eof(what))?;
        if pos.saturating_add(n) > self.len {
            return Err(HeaderProblem::Truncated(format!(
                "the file ends inside the {what}"
            )));
        }
        let mut name = vec![0u8; n as usize];
        self.r.read_exact(&mut name).map_err(eof(what))?;
        let dims = self.u32(what)?;
        let dim_bytes = if self.v1 { 4 } else { 8 };
        self.skip(u64::from(dims) * dim_bytes, what)?;
        let type_id = self.u32(what)?;
        if !CANDLE_TYPE_IDS.contains(&type_id) {
            let tensor = String::from_utf8_lossy(&name).into_owned();
            return Ok(Some(HeaderProblem::UnsupportedType { tensor, type_id }));
        }
        self.u64(what)?;
        Ok(None)
    }
}

fn supported_types() -> &'static str {
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K"
}

/// Read the header (metadata and tensor table) of a GGUF file, with named errors for a
/// truncated file and an unsupported tensor type.
pub fn read_content(path: &Path) -> Result<Content> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = BufReader::new(file);
    match Content::read(&mut r) {
        Ok(c) => Ok(c),
        Err(e) => {
            let e = crate::model::candle_message(&e);
            let problem = diagnose_header(&mut r);
            match problem {
                HeaderProblem::Truncated(why) => {
                    bail!("truncated GGUF file {}: {why} ({e})", path.display())
                }
                HeaderProblem::UnsupportedType { tensor, type_id } => bail!(
                    "unsupported tensor type {} (ggml type {type_id}) of tensor {tensor} in {}: \
                     candle reads {}",
                    ggml_type_name(type_id),
                    path.display(),
                    supported_types()
                ),
                HeaderProblem::Other(why) if !why.is_empty() => {
                    bail!("reading the GGUF header of {}: {why} ({e})", path.display())
                }
                HeaderProblem::Other(_) => {
                    bail!("reading the GGUF header of {}: {e}", path.display())
                }
            }
        }
    }
}

pub(super) fn type_name(t: GgmlDType) -> String {
    format!("{t:?}")
}

/// Bytes a tensor of `elems` elements of type `t` occupies.
pub(super) fn tensor_bytes(t: GgmlDType, elems: usize) -> usize {
    elems / t.block_size() * t.type_size()
}
