//! Scenarios: the serde schema, the four embedded levels, files on disk, validation and
//! the seeded generator.
//!
//! Times are `"HH:MM"` strings (minutes of one day, UTC); a scenario never crosses
//! midnight. [`Scenario::validate`] checks everything the episode and the grader rely
//! on, so a scenario that loads is playable and the oracle can reach full marks.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The difficulty levels, in order.
pub const LEVELS: [&str; 4] = ["easy", "medium", "hard", "expert"];

/// Every level a scenario may carry: the four levels and `imported`.
pub const ALL_LEVELS: [&str; 5] = ["easy", "medium", "hard", "expert", "imported"];

/// The embedded scenario files, one per level.
pub const EMBEDDED: [(&str, &str); 4] = [
    ("easy", include_str!("scenarios/easy.json")),
    ("medium", include_str!("scenarios/medium.json")),
    ("hard", include_str!("scenarios/hard.json")),
    ("expert", include_str!("scenarios/expert.json")),
];

/// The five post-mortem sections, in document order.
pub const SECTIONS: [&str; 5] = [
    "summary",
    "timeline",
    "root_cause",
    "impact",
    "action_items",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub id: String,
    pub title: String,
    /// One of [`LEVELS`] (imports use `"imported"`).
    pub level: String,
    /// `YYYY-MM-DD`, the day of the incident (due dates count from it).
    pub date: String,
    pub alerts: Vec<Alert>,
    pub slack: Vec<SlackMessage>,
    pub services: Vec<ServiceNode>,
    /// Services a query may be "correct" for.
    pub relevant_services: Vec<String>,
    pub evidence: Vec<EvidenceWindow>,
    /// Returned (a slice of them) for a wrong query.
    #[serde(default)]
    pub noise_logs: Vec<LogLine>,
    pub gold: Gold,
    pub limits: Limits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alert {
    pub time: String,
    pub severity: String,
    pub service: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackMessage {
    pub time: String,
    pub author: String,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceNode {
    pub name: String,
    #[serde(default)]
    pub depends_on: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogLine {
    pub time: String,
    pub service: String,
    pub level: String,
    pub message: String,
}

/// Logs only a query of `service` overlapping `[from, to]` by at least
/// `overlap_required_minutes` reveals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceWindow {
    pub service: String,
    pub from: String,
    pub to: String,
    pub overlap_required_minutes: u32,
    pub logs: Vec<LogLine>,
    /// Strings of the logs a root cause should quote (the reviewer's evidence check).
    pub key_evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gold {
    pub root_cause: RootCause,
    /// Events visible from alerts and Slack.
    pub timeline: Vec<GoldEvent>,
    /// Events only the evidence logs show.
    #[serde(default)]
    pub hidden_timeline: Vec<GoldEvent>,
    pub action_themes: Vec<Theme>,
    /// Owners an action item may name.
    pub teams: Vec<String>,
    /// Due dates must fall within this many days of `date`.
    pub due_within_days: u32,
    pub impact: Impact,
    /// Services planted as plausible but wrong causes.
    #[serde(default)]
    pub false_causes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootCause {
    pub service: String,
    pub category: String,
    /// Any of these (case-insensitive) names the category.
    pub category_terms: Vec<String>,
    pub keywords: Vec<String>,
}

/// A timeline event: matched by a timeline line within +-3 minutes that contains any
/// keyword (case-insensitive). `text` is what the oracle writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldEvent {
    pub time: String,
    pub text: String,
    pub keywords: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Theme {
    pub name: String,
    pub keywords: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Impact {
    pub duration_minutes: u32,
    pub services: Vec<String>,
    /// Any of these (case-insensitive) states the scale.
    pub scale: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_queries: u32,
    /// Penalty of the 1st, 2nd, ... wrong query; the last repeats.
    pub penalties: Vec<f64>,
}

/// Minutes since midnight of `"HH:MM"` (also `"H:MM"`); None if malformed.
pub fn parse_hhmm(s: &str) -> Option<u32> {
    let (h, m) = s.trim().split_once(':')?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return None;
    }
    let h: u32 = h.parse().ok()?;
    let m: u32 = m.parse().ok()?;
    (h < 24 && m < 60).then_some(h * 60 + m)
}

/// `"HH:MM"` of minutes since midnight.
pub fn hhmm(m: u32) -> String {
    format!("{:02}:{:02}", (m / 60) % 24, m % 60)
}

/// Days since 1970-01-01 of a `YYYY-MM-DD` date (proleptic Gregorian).
pub fn parse_date(s: &str) -> Option<i64> {
    let b = s.trim().as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let s = s.trim();
    let y: i64 = s[0..4].parse().ok()?;
    let m: i64 = s[5..7].parse().ok()?;
    let d: i64 = s[8..10].parse().ok()?;
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// `YYYY-MM-DD` of days since 1970-01-01.
pub fn format_date(z: i64) -> String {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

impl Scenario {
    /// Parse and validate one scenario's JSON; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> anyhow::Result<Self> {
        let s: Scenario = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("{origin}: not a postmortem scenario: {e}"))?;
        s.validate()
            .map_err(|e| anyhow::anyhow!("{origin}: invalid scenario: {e}"))?;
        Ok(s)
    }

    /// The embedded scenario of `level`.
    pub fn embedded(level: &str) -> anyhow::Result<Self> {
        let (_, text) = EMBEDDED.iter().find(|(l, _)| *l == level).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown postmortem level `{level}`; levels: {}",
                LEVELS.join(", ")
            )
        })?;
        Self::from_json(text, &format!("embedded {level}.json"))
    }

    /// Whether `name` is a service of the dependency graph.
    pub fn has_service(&self, name: &str) -> bool {
        self.services.iter().any(|s| s.name == name)
    }

    /// Every gold timeline event, visible then hidden.
    pub fn all_events(&self) -> impl Iterator<Item = &GoldEvent> {
        self.gold.timeline.iter().chain(&self.gold.hidden_timeline)
    }

    /// First and last minute of the incident (alerts, Slack and evidence logs).
    pub fn span(&self) -> (u32, u32) {
        let times = self
            .alerts
            .iter()
            .map(|a| a.time.as_str())
            .chain(self.slack.iter().map(|m| m.time.as_str()))
            .chain(self.evidence.iter().map(|w| w.from.as_str()))
            .filter_map(parse_hhmm);
        let (mut lo, mut hi) = (u32::MAX, 0);
        for t in times {
            lo = lo.min(t);
            hi = hi.max(t);
        }
        if lo > hi {
            (0, 0)
        } else {
            (lo, hi)
        }
    }

    /// Everything the episode and the grader rely on.
    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::ensure;
        ensure!(!self.id.trim().is_empty(), "`id` is empty");
        ensure!(
            ALL_LEVELS.contains(&self.level.as_str()),
            "`level` `{}` is not one of {}",
            self.level,
            ALL_LEVELS.join(", ")
        );
        ensure!(
            parse_date(&self.date).is_some(),
            "`date` `{}` is not YYYY-MM-DD",
            self.date
        );
        ensure!(!self.services.is_empty(), "`services` is empty");
        let t = |what: &str, s: &str| -> anyhow::Result<u32> {
            parse_hhmm(s).ok_or_else(|| anyhow::anyhow!("{what}: time `{s}` is not HH:MM"))
        };
        let svc = |what: &str, s: &str| -> anyhow::Result<()> {
            ensure!(self.has_service(s), "{what}: `{s}` is not in `services`");
            Ok(())
        };
        for (i, n) in self.services.iter().enumerate() {
            ensure!(!n.name.trim().is_empty(), "services[{i}] has no name");
            ensure!(
                self.services.iter().filter(|m| m.name == n.name).count() == 1,
                "service `{}` is listed twice",
                n.name
            );
            for d in &n.depends_on {
                svc(&format!("services[{i}].depends_on"), d)?;
            }
        }
        for (i, a) in self.alerts.iter().enumerate() {
            t(&format!("alerts[{i}]"), &a.time)?;
            svc(&format!("alerts[{i}].service"), &a.service)?;
        }
        for (i, m) in self.slack.iter().enumerate() {
            t(&format!("slack[{i}]"), &m.time)?;
        }
        for s in &self.relevant_services {
            svc("relevant_services", s)?;
        }
        ensure!(!self.evidence.is_empty(), "`evidence` has no window");
        for (i, w) in self.evidence.iter().enumerate() {
            let what = format!("evidence[{i}]");
            svc(&what, &w.service)?;
            ensure!(
                self.relevant_services.contains(&w.service),
                "{what}: `{}` is not a relevant service",
                w.service
            );
            let (a, b) = (t(&what, &w.from)?, t(&what, &w.to)?);
            ensure!(a < b, "{what}: `from` must be before `to`");
            ensure!(
                w.overlap_required_minutes >= 1 && w.overlap_required_minutes <= b - a,
                "{what}: overlap_required_minutes must be in 1..={}",
                b - a
            );
            ensure!(!w.logs.is_empty(), "{what}: no logs");
            for l in &w.logs {
                t(&what, &l.time)?;
            }
            ensure!(!w.key_evidence.is_empty(), "{what}: no key_evidence");
            for k in &w.key_evidence {
                ensure!(
                    w.logs.iter().any(|l| l.message.contains(k.as_str())),
                    "{what}: key evidence `{k}` is in none of its logs"
                );
            }
        }
        for l in &self.noise_logs {
            t("noise_logs", &l.time)?;
        }
        let g = &self.gold;
        svc("gold.root_cause.service", &g.root_cause.service)?;
        ensure!(
            !g.root_cause.category_terms.is_empty(),
            "gold.root_cause.category_terms is empty"
        );
        ensure!(
            !g.root_cause.keywords.is_empty(),
            "gold.root_cause.keywords is empty"
        );
        ensure!(!g.timeline.is_empty(), "gold.timeline is empty");
        for e in self.all_events() {
            t("gold timeline", &e.time)?;
            let lower = e.text.to_lowercase();
            ensure!(
                e.keywords.iter().any(|k| has_word(&lower, k)),
                "gold timeline event `{}`: its text contains none of its keywords",
                e.text
            );
        }
        ensure!(!g.action_themes.is_empty(), "gold.action_themes is empty");
        for th in &g.action_themes {
            ensure!(
                !th.keywords.is_empty(),
                "action theme `{}` has no keywords",
                th.name
            );
        }
        ensure!(!g.teams.is_empty(), "gold.teams is empty");
        ensure!(g.due_within_days >= 1, "gold.due_within_days must be >= 1");
        ensure!(
            g.impact.duration_minutes >= 1,
            "gold.impact.duration_minutes must be >= 1"
        );
        ensure!(
            !g.impact.services.is_empty(),
            "gold.impact.services is empty"
        );
        ensure!(!g.impact.scale.is_empty(), "gold.impact.scale is empty");
        for f in &g.false_causes {
            svc("gold.false_causes", f)?;
            ensure!(
                *f != g.root_cause.service,
                "false cause `{f}` is the root cause"
            );
        }
        ensure!(
            self.limits.max_queries >= 1,
            "limits.max_queries must be >= 1"
        );
        ensure!(
            !self.limits.penalties.is_empty()
                && self
                    .limits
                    .penalties
                    .iter()
                    .all(|p| p.is_finite() && *p >= 0.0),
            "limits.penalties must be a non-empty list of non-negative numbers"
        );
        Ok(())
    }
}

// -------------------------------------------------------------------------------------
// The seeded generator.

/// Stems of service names the generator renames, each with its pool (the first entry
/// is the stem itself). Pools are disjoint, so renames never collide.
const STEMS: &[&[&str]] = &[
    &["orders", "billing", "ledger", "bookings"],
    &["payments", "wallet", "charges"],
    &["catalog", "products", "listings"],
    &["cart", "basket"],
    &["search", "discovery"],
    &["inventory", "stock", "warehouse"],
    &["checkout", "purchase"],
    &["partner", "vendor", "affiliate"],
    &["customer", "account", "member"],
    &["session", "token", "profile"],
];

/// Red-herring alert messages (a service name is attached at generation).
const HERRING_ALERTS: &[&str] = &[
    "GC pause 1.8s on 2 pods",
    "certificate expires in 21 days",
    "disk usage 81% on /var/log",
    "p95 latency 420ms (threshold 400ms)",
    "pod restarted (OOMKilled) once",
    "retry rate 3.2% (baseline 1%)",
];

/// Log-noise messages.
const NOISE: &[&str] = &[
    "health check ok",
    "connection pool stats: 41/200 in use",
    "feature flag cache refreshed",
    "slow request 1.3s GET /healthz",
    "rotated log file",
    "autoscaler: no change (cpu 48%)",
    "cache warmup finished",
];

/// A variant of `base`, a pure function of `seed`: service-name stems renamed
/// consistently through every string, every `HH:MM` shifted by one offset (the
/// incident stays inside the day), one to three red-herring alerts on services outside
/// the causal story, and two to five extra noise log lines. The gold standard follows
/// the renames and the shift, so the variant is graded exactly like its base.
pub fn generate(base: &Scenario, seed: u64) -> Scenario {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    // Renames of the stems present.
    let mut renames: Vec<(String, String)> = Vec::new();
    for pool in STEMS {
        let stem = pool[0];
        if base.services.iter().any(|s| word_in(&s.name, stem)) {
            let to = pool.choose(&mut rng).copied().unwrap_or(stem);
            if to != stem {
                renames.push((stem.to_string(), to.to_string()));
            }
        }
    }
    // The time shift: keep every HH:MM of the scenario inside the day.
    let mut value = serde_json::to_value(base).expect("scenario serialises");
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    visit_strings(&mut value, &mut |s| {
        for t in times_in(s) {
            lo = lo.min(t);
            hi = hi.max(t);
        }
    });
    let shift: i64 = if lo <= hi {
        let min = -(lo as i64).min(300);
        let max = (1439 - hi as i64).min(300);
        rng.gen_range(min..=max.max(min))
    } else {
        0
    };
    visit_strings(&mut value, &mut |s| {
        let mut t = shift_times(s, shift);
        for (from, to) in &renames {
            t = replace_word(&t, from, to);
        }
        *s = t;
    });
    let mut sc: Scenario = serde_json::from_value(value).expect("variant deserialises");
    sc.id = format!("{}-gen{seed}", sc.id);
    // Red herrings on services outside the story.
    let bystanders: Vec<String> = sc
        .services
        .iter()
        .map(|s| s.name.clone())
        .filter(|n| !sc.relevant_services.contains(n) && *n != sc.gold.root_cause.service)
        .collect();
    let (a, b) = sc.span();
    if !bystanders.is_empty() {
        for _ in 0..rng.gen_range(1..=3) {
            let service = bystanders.choose(&mut rng).cloned().unwrap_or_default();
            sc.alerts.push(Alert {
                time: hhmm(rng.gen_range(a..=b.max(a))),
                severity: "warning".into(),
                service,
                message: HERRING_ALERTS
                    .choose(&mut rng)
                    .copied()
                    .unwrap_or("")
                    .into(),
            });
        }
        sc.alerts.sort_by_key(|x| parse_hhmm(&x.time));
    }
    let names: Vec<String> = sc.services.iter().map(|s| s.name.clone()).collect();
    for _ in 0..rng.gen_range(2..=5) {
        sc.noise_logs.push(LogLine {
            time: hhmm(rng.gen_range(a..=b.max(a))),
            service: names.choose(&mut rng).cloned().unwrap_or_default(),
            level: "INFO".into(),
            message: NOISE.choose(&mut rng).copied().unwrap_or("").into(),
        });
    }
    sc.noise_logs.sort_by_key(|x| parse_hhmm(&x.time));
    sc
}

fn visit_strings(v: &mut serde_json::Value, f: &mut dyn FnMut(&mut String)) {
    match v {
        serde_json::Value::String(s) => f(s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| visit_strings(x, f)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| visit_strings(x, f)),
        _ => {}
    }
}

/// Whether `word` occurs in `s` delimited by non-alphanumerics.
fn word_in(s: &str, word: &str) -> bool {
    replace_word(s, word, "\u{0}") != s
}

/// `s` with every whole-word `from` (neighbours not alphanumeric) replaced by `to`.
pub fn replace_word(s: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    let mut prev_alnum = false;
    while let Some(i) = rest.find(from) {
        let before_ok = if i == 0 {
            !prev_alnum
        } else {
            !rest[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric())
        };
        let after = &rest[i + from.len()..];
        let after_ok = !after.chars().next().is_some_and(|c| c.is_alphanumeric());
        out.push_str(&rest[..i]);
        if before_ok && after_ok {
            out.push_str(to);
        } else {
            out.push_str(from);
        }
        prev_alnum = from
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric());
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `(start byte, minutes)` of every standalone `HH:MM` in `s`.
pub(crate) fn time_spans(s: &str) -> Vec<(usize, u32)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let d = |i: usize| b.get(i).is_some_and(|c| c.is_ascii_digit());
    let mut i = 0;
    while i + 5 <= b.len() {
        if d(i)
            && d(i + 1)
            && b[i + 2] == b':'
            && d(i + 3)
            && d(i + 4)
            && !(i > 0 && (d(i - 1) || b[i - 1] == b':'))
            && !d(i + 5)
            && b.get(i + 5) != Some(&b':')
        {
            if let Some(t) = parse_hhmm(&s[i..i + 5]) {
                out.push((i, t));
                i += 5;
                continue;
            }
        }
        i += 1;
    }
    out
}

fn times_in(s: &str) -> Vec<u32> {
    time_spans(s).into_iter().map(|(_, t)| t).collect()
}

fn shift_times(s: &str, shift: i64) -> String {
    let spans = time_spans(s);
    if spans.is_empty() || shift == 0 {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for (i, t) in spans {
        out.push_str(&s[at..i]);
        out.push_str(&hhmm((t as i64 + shift).clamp(0, 1439) as u32));
        at = i + 5;
    }
    out.push_str(&s[at..]);
    out
}

/// Counts of every level in a list of scenarios (for `describe`).
pub fn level_counts(list: &[Scenario]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for s in list {
        *m.entry(s.level.clone()).or_insert(0) += 1;
    }
    m
}

/// Whether `needle` occurs in `lower` (already lowercase) as a whole word: the
/// characters around it are not alphanumeric (so `tor` does not match `regulator`).
pub fn has_word(lower: &str, needle: &str) -> bool {
    let n = needle.trim().to_lowercase();
    if n.is_empty() {
        return false;
    }
    let mut from = 0;
    while let Some(i) = lower[from..].find(&n) {
        let at = from + i;
        let before = lower[..at].chars().next_back();
        let after = lower[at + n.len()..].chars().next();
        let edge = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric());
        let first = n.chars().next().is_some_and(|c| c.is_alphanumeric());
        let last = n.chars().next_back().is_some_and(|c| c.is_alphanumeric());
        if (!first || edge(before)) && (!last || edge(after)) {
            return true;
        }
        from = at + n.chars().next().map_or(1, char::len_utf8);
    }
    false
}
