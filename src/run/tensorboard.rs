//! TensorBoard event files (`[run] report_to = ["csv", "tensorboard"]`): every column of
//! a row just appended to `training_log.csv` or `eval_log.csv`, as scalars at the row's
//! step, in `RUN_DIR/tensorboard/`.
//!
//! Written by hand because the format is small and no maintained crate writes it without
//! a protobuf toolchain. A file is a sequence of TFRecords (tensorflow
//! `core/lib/io/record_writer.cc`): the data length as a little-endian u64, the masked
//! CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data. Each record is a
//! serialised `tensorflow.Event` (`core/util/event.proto`): `wall_time` (field 1,
//! double), `step` (2, int64), `file_version` (3, the first event: "brain.Event:2") or
//! `summary` (5), whose `value`s (1) each hold a `tag` (1) and a `simple_value` (2,
//! float).
//!
//! A resume truncates the events to the checkpoint's step as it truncates the CSV logs,
//! so a step is never plotted twice, drops a record a crash cut, and goes on in a new
//! file (see [`files`]).
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder under the run directory (`tensorboard --logdir runs` shows every run).
pub const DIR: &str = "tensorboard";
const FILE_VERSION: &str = "brain.Event:2";

/// One event: a file-version header, or the scalars of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub file_version: Option<String>,
    pub scalars: Vec<(String, f32)>,
}

/// The run's event files, oldest first. A run writes one, and a resume starts another:
/// a TensorBoard left running keeps reading the file it has open, so a file rewritten
/// in place (a new inode) would never show the resumed steps, while a new file is
/// picked up, and its first step, lower than what was read, purges the orphaned ones.
/// The names sort by creation time (TensorBoard reads them in name order).
pub fn files(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let dir = run_dir.join(DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut out = Vec::new();
    for e in entries {
        let p = e
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("events.out.tfevents.") && name.ends_with(".concord") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Every event of the run, file after file.
pub fn read_all(run_dir: &Path) -> Result<Vec<Event>> {
    let mut out = Vec::new();
    for p in files(run_dir)? {
        out.extend(read(&p)?);
    }
    Ok(out)
}

/// Append the scalars `prefix/<column>` of one CSV row (`header` and its `line`, as
/// written to the CSV) at the row's `step`. Empty cells (a column the row does not
/// have) are left out; `step`, `stage` and `env` are not scalars.
pub fn append_csv_row(
    run_dir: &Path,
    prefix: &str,
    header: &[String],
    line: &str,
    step: usize,
) -> Result<()> {
    let cells = line.split(',');
    let scalars = header
        .iter()
        .zip(cells)
        .filter(|(h, _)| !matches!(h.as_str(), "step" | "stage" | "env"))
        .filter_map(|(h, c)| Some((format!("{prefix}/{h}"), c.trim().parse::<f32>().ok()?)))
        .collect();
    append(run_dir, step, scalars)
}

/// Append one event with `scalars` at `step` to the newest file, starting one when
/// there is none.
pub fn append(run_dir: &Path, step: usize, scalars: Vec<(String, f32)>) -> Result<()> {
    let p = match files(run_dir)?.pop() {
        Some(p) => p,
        None => start_file(run_dir)?,
    };
    let bytes = record(&encode(&Event {
        wall_time: now(),
        step: step as i64,
        file_version: None,
        scalars,
    }));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .with_context(|| format!("opening {}", p.display()))?;
    f.write_all(&bytes)
        .and_then(|()| f.flush())
        .with_context(|| format!("appending to {}", p.display()))
}

/// A new events file holding its version event, named after the time (and after
/// every existing file).
fn start_file(run_dir: &Path) -> Result<PathBuf> {
    let dir = run_dir.join(DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut p = dir.join(format!(
        "events.out.tfevents.{:010}.{:09}.concord",
        t.as_secs(),
        t.subsec_nanos()
    ));
    if let Some(last) = files(run_dir)?.pop().filter(|last| *last >= p) {
        // A clock set back: still sort after the newest.
        let name = last
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        p = dir.join(name.replace(".concord", ".1.concord"));
    }
    let version = record(&encode(&Event {
        wall_time: now(),
        step: 0,
        file_version: Some(FILE_VERSION.into()),
        scalars: Vec::new(),
    }));
    crate::atomic::atomic_write_bytes(&p, &version)?;
    Ok(p)
}

/// A resume from `step`: every file keeps its events at or before `step` (and its
/// version event), a record a crash cut at a file's end is dropped, and the resumed
/// run appends to a new file. Atomic rewrites; nothing to do without files.
pub fn truncate(run_dir: &Path, step: usize) -> Result<()> {
    let all = files(run_dir)?;
    if all.is_empty() {
        return Ok(());
    }
    for p in all {
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        let mut out = Vec::new();
        for data in records(&bytes, true).with_context(|| format!("reading {}", p.display()))? {
            let e = decode(data).with_context(|| format!("reading {}", p.display()))?;
            if e.file_version.is_some() || e.step <= step as i64 {
                out.extend(record(data));
            }
        }
        if out != bytes {
            crate::atomic::atomic_write_bytes(&p, &out)?;
        }
    }
    start_file(run_dir).map(|_| ())
}

/// Remove an earlier run's events (a fresh run starts fresh logs).
pub fn remove(run_dir: &Path) -> Result<()> {
    for p in files(run_dir)? {
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(())
}

/// Every event of the file at `p`, checking both CRCs of every record.
pub fn read(p: &Path) -> Result<Vec<Event>> {
    let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    records(&bytes, false)
        .and_then(|rs| rs.into_iter().map(decode).collect())
        .with_context(|| format!("reading {}", p.display()))
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One TFRecord around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The records' data. A bad CRC is an error (naming its offset) unless it is the
/// last, cut record and `allow_cut_tail` is set (what a crash mid-write leaves).
pub fn records(bytes: &[u8], allow_cut_tail: bool) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        // A crash cuts the last record short; a length whose CRC fails is damage.
        let header = rest.len() >= 12;
        if header && masked_crc(&rest[..8]) != u32_at(rest, 8) {
            bail!("record at byte {at}: its length's CRC does not match");
        }
        let len = if header {
            u64::from_le_bytes(rest[..8].try_into().unwrap_or_default())
        } else {
            0
        };
        if !header || (rest.len() as u64) < len.saturating_add(16) {
            if allow_cut_tail {
                break;
            }
            bail!("record at byte {at}: cut short");
        }
        let len = len as usize;
        let data = &rest[12..12 + len];
        if masked_crc(data) != u32_at(rest, 12 + len) {
            if allow_cut_tail && at + 16 + len == bytes.len() {
                break;
            }
            bail!("record at byte {at}: the data's CRC does not match");
        }
        out.push(data);
        at += 16 + len;
    }
    Ok(out)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default())
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bitwise: the events of a run
/// are a few KB a step.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// TFRecord's mask, so that a CRC stored inside checksummed data does not checksum
/// to a fixed value.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Serialise `e` as a `tensorflow.Event`.
pub fn encode(e: &Event) -> Vec<u8> {
    let mut out = vec![0x09]; // field 1, 64-bit
    out.extend_from_slice(&e.wall_time.to_le_bytes());
    out.push(0x10); // field 2, varint
    varint(&mut out, e.step as u64);
    if let Some(v) = &e.file_version {
        bytes_field(&mut out, 3, v.as_bytes());
    }
    if !e.scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, x) in &e.scalars {
            let mut value = Vec::new();
            bytes_field(&mut value, 1, tag.as_bytes());
            value.push(0x15); // field 2, 32-bit
            value.extend_from_slice(&x.to_le_bytes());
            bytes_field(&mut summary, 1, &value);
        }
        bytes_field(&mut out, 5, &summary);
    }
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u8, b: &[u8]) {
    out.push(field << 3 | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Parse a `tensorflow.Event` (the fields [`encode`] writes; others are skipped).
pub fn decode(b: &[u8]) -> Result<Event> {
    let mut e = Event {
        wall_time: 0.0,
        step: 0,
        file_version: None,
        scalars: Vec::new(),
    };
    for (field, v) in fields(b)? {
        match (field, v) {
            (1, Wire::Fixed64(x)) => e.wall_time = f64::from_le_bytes(x),
            (2, Wire::Varint(x)) => e.step = x as i64,
            (3, Wire::Bytes(s)) => e.file_version = Some(String::from_utf8_lossy(s).into()),
            (5, Wire::Bytes(s)) => {
                for (f, v) in fields(s)? {
                    if let (1, Wire::Bytes(value)) = (f, v) {
                        e.scalars.push(scalar(value)?);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(e)
}

fn scalar(b: &[u8]) -> Result<(String, f32)> {
    let (mut tag, mut x) = (String::new(), None);
    for (f, v) in fields(b)? {
        match (f, v) {
            (1, Wire::Bytes(s)) => tag = String::from_utf8_lossy(s).into(),
            (2, Wire::Fixed32(v)) => x = Some(f32::from_le_bytes(v)),
            _ => {}
        }
    }
    Ok((tag, x.context("a summary value without simple_value")?))
}

enum Wire<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The (field number, value) pairs of one protobuf message.
fn fields(mut b: &[u8]) -> Result<Vec<(u64, Wire<'_>)>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
        if b.len() < n {
            bail!("protobuf message cut: {n} bytes wanted, {} left", b.len());
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Ok(head)
    }
    fn read_varint(b: &mut &[u8]) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = take(b, 1)?[0];
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return Ok(v);
            }
        }
        bail!("protobuf varint longer than 10 bytes")
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = read_varint(&mut b)?;
        let v = match key & 7 {
            0 => Wire::Varint(read_varint(&mut b)?),
            1 => Wire::Fixed64(take(&mut b, 8)?.try_into()?),
            2 => {
                let n = read_varint(&mut b)? as usize;
                Wire::Bytes(take(&mut b, n)?)
            }
            5 => Wire::Fixed32(take(&mut b, 4)?.try_into()?),
            w => bail!("protobuf wire type {w} not supported"),
        };
        out.push((key >> 3, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC-32C check value (RFC 3720's and every CRC catalogue's "123456789"), and
    /// iSCSI's 32 zero bytes.
    #[test]
    fn crc32c_matches_the_published_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
    }

    /// An event serialises to the bytes protobuf's own encoder writes for it (worked
    /// out by hand from the wire format: tag byte = field << 3 | wire type).
    #[test]
    fn an_event_encodes_to_protobuf_wire_bytes() {
        let e = Event {
            wall_time: 1.5,
            step: 300,
            file_version: None,
            scalars: vec![("a".into(), 2.0)],
        };
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0xAC, 0x02]); // 300 = 0b10_0101100
        want.extend_from_slice(&[0x2A, 0x0A, 0x0A, 0x08, 0x0A, 0x01, b'a', 0x15]);
        want.extend_from_slice(&2.0f32.to_le_bytes());
        assert_eq!(encode(&e), want);
        assert_eq!(decode(&want).unwrap(), e);
    }

    #[test]
    fn records_check_both_crcs_and_a_cut_tail_is_dropped_only_on_request() {
        let (a, b) = (record(b"first"), record(b"second"));
        let mut file = [a.clone(), b.clone()].concat();
        assert_eq!(
            records(&file, false).unwrap(),
            vec![&b"first"[..], b"second"]
        );
        file[a.len() + 13] ^= 1; // inside the second record's data
        let err = records(&file, false).unwrap_err().to_string();
        assert!(err.contains(&format!("byte {}", a.len())), "{err}");
        assert_eq!(records(&file, true).unwrap(), vec![&b"first"[..]]);
        let cut = [a.clone(), b[..b.len() - 3].to_vec()].concat();
        assert!(records(&cut, false).is_err());
        assert_eq!(records(&cut, true).unwrap(), vec![&b"first"[..]]);
        let mut bad_middle = [a.clone(), b.clone()].concat();
        bad_middle[14] ^= 1; // inside the first record's data
        assert!(records(&bad_middle, true).is_err());
    }

    /// Rows appended as CSV come back as scalars at their steps; a resume's truncation
    /// keeps the version event and the steps up to the checkpoint, drops a record a
    /// crash cut, and goes on in a newer file.
    #[test]
    fn csv_rows_become_scalars_and_a_resume_truncates_them() {
        let d = tempfile::tempdir().unwrap();
        let header: Vec<String> = ["step", "stage", "reward", "kl", "entropy"]
            .map(String::from)
            .to_vec();
        for step in 1..=4 {
            let line = format!("{step},main,{},0.5,", step as f64 / 8.0);
            append_csv_row(d.path(), "train", &header, &line, step).unwrap();
        }
        let first = files(d.path()).unwrap();
        assert_eq!(first.len(), 1);
        let events = read_all(d.path()).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(
            events[3].scalars,
            vec![("train/reward".into(), 0.375), ("train/kl".into(), 0.5)]
        );
        assert_eq!(events[3].step, 3);
        let mut bytes = std::fs::read(&first[0]).unwrap();
        bytes.truncate(bytes.len() - 5);
        std::fs::write(&first[0], &bytes).unwrap();
        truncate(d.path(), 2).unwrap();
        let steps =
            |d: &Path| -> Vec<i64> { read_all(d).unwrap().iter().map(|e| e.step).collect() };
        assert_eq!(steps(d.path()), vec![0, 1, 2, 0]);
        append_csv_row(d.path(), "train", &header, "3,main,0.25,0.1,", 3).unwrap();
        let now = files(d.path()).unwrap();
        assert_eq!((now.len(), &now[0]), (2, &first[0]), "a newer file");
        assert_eq!(steps(d.path()), vec![0, 1, 2, 0, 3]);
        remove(d.path()).unwrap();
        assert!(files(d.path()).unwrap().is_empty());
        truncate(d.path(), 2).unwrap();
        assert!(files(d.path()).unwrap().is_empty());
    }

    /// Damage before a file's last record is an error, even where a cut tail is
    /// forgiven: a length whose CRC fails is not what a crash leaves.
    #[test]
    fn a_damaged_length_is_an_error_not_a_cut_tail() {
        let (a, b) = (record(b"first"), record(b"second"));
        let mut file = [a.clone(), b.clone()].concat();
        file[a.len() + 2] ^= 1;
        assert!(records(&file, true).is_err());
        assert!(records(&[a.clone(), b[..13].to_vec()].concat(), true).is_ok());
        assert!(records(&[a.clone(), b[..10].to_vec()].concat(), true).is_ok());
        let mut zero = record(b"");
        assert_eq!(records(&zero, false).unwrap(), vec![&b""[..]]);
        zero.truncate(14);
        assert!(records(&zero, true).unwrap().is_empty());
    }
}
