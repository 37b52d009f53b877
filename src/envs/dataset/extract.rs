//! Where a verifier looks in a completion, and how numbers are read from text. Every
//! rule here is documented in `docs/your-own-task.md`; the tests pin each one.

/// The part of a completion a verifier judges (`extract` in a verifier's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extract {
    /// The whole completion (`"completion"`, the default).
    Completion,
    /// The text of the last `<answer>...</answer>`; an unclosed last `<answer>` runs to
    /// the end of the completion (`"answer_tag"`).
    AnswerTag,
    /// The content of the last `\boxed{...}`, braces balanced (`"boxed"`).
    Boxed,
    /// The last line that is not blank, trimmed (`"last_line"`).
    LastLine,
}

impl Extract {
    pub const NAMES: &'static [&'static str] = &["completion", "answer_tag", "boxed", "last_line"];

    /// The config's name of this extraction.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Completion => "completion",
            Self::AnswerTag => "answer_tag",
            Self::Boxed => "boxed",
            Self::LastLine => "last_line",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "completion" => Self::Completion,
            "answer_tag" => Self::AnswerTag,
            "boxed" => Self::Boxed,
            "last_line" => Self::LastLine,
            _ => return None,
        })
    }

    /// The judged text, or `None` when the marker it looks for is absent (the verifier
    /// then scores 0).
    pub fn apply<'a>(&self, text: &'a str) -> Option<&'a str> {
        match self {
            Self::Completion => Some(text),
            Self::AnswerTag => answer_tag(text),
            Self::Boxed => last_boxed(text),
            Self::LastLine => text.lines().rev().map(str::trim).find(|l| !l.is_empty()),
        }
    }
}

/// The text of the last `<answer>` tag (to its `</answer>`, or to the end).
pub fn answer_tag(text: &str) -> Option<&str> {
    let start = text.rfind("<answer>")? + "<answer>".len();
    let rest = &text[start..];
    Some(
        rest.find("</answer>")
            .map_or(rest, |end| &rest[..end])
            .trim(),
    )
}

/// The content of the last `\boxed{...}` whose braces close.
pub fn last_boxed(text: &str) -> Option<&str> {
    let mut from = text.len();
    while let Some(at) = text[..from].rfind("\\boxed{") {
        let open = at + "\\boxed{".len();
        if let Some(len) = balanced(&text[open..]) {
            return Some(text[open..open + len].trim());
        }
        from = at;
    }
    None
}

/// Length of the text up to the `}` that closes an already opened `{`.
fn balanced(s: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// A number written in text: `[sign] [$] digits [, ddd]* [. digits] [e[±]digits]`
/// (or `.digits`), optionally `/ number` right after (a fraction); or a LaTeX fraction
/// `\frac{a}{b}` (also `\dfrac`, `\tfrac`, and `\frac12`). The sign (`-`, `+` or
/// the unicode minus `−`) counts unless it follows an ASCII letter, a digit or a
/// closing bracket, so `2-3` and `(2)-3` hold 2 and 3, not -3, while `<answer>-64`,
/// `= -1` and `答案是−3` hold negatives. A comma groups thousands only when exactly
/// three digits follow it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Found {
    value: f64,
    end: usize,
}

/// Every number in `text`, in order.
pub fn numbers(text: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        match number_at(text, i) {
            Some(f) => {
                out.push(f.value);
                i = f.end;
            }
            None => i += text[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// The number a completion answers with, by the first rule that finds one: the last
/// number inside the last `\boxed{}`; the first number after the last `####`; the
/// last number of the text.
pub fn answer_number(text: &str) -> Option<f64> {
    let boxed = last_boxed(text).and_then(|b| numbers(b).last().copied());
    let marked = || {
        let at = text.rfind("####")?;
        numbers(&text[at + 4..]).first().copied()
    };
    boxed
        .or_else(marked)
        .or_else(|| numbers(text).last().copied())
}

fn number_at(text: &str, i: usize) -> Option<Found> {
    let rest = &text[i..];
    let first = rest.chars().next()?;
    let (negative, mut at) = match first {
        '-' | '\u{2212}' | '+' if sign_allowed(text, i) => (first != '+', i + first.len_utf8()),
        c if c.is_ascii_digit() || c == '.' || c == '\\' => (false, i),
        _ => return None,
    };
    if at == i && text[..i].ends_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if text[at..].starts_with('$') {
        at += 1;
    }
    let (mut value, mut end) = match latex_fraction(text, at) {
        Some(f) => (f.value, f.end),
        None => unsigned(text, at)?,
    };
    if let Some((den, den_end)) = text[end..]
        .strip_prefix('/')
        .and_then(|_| unsigned(text, end + 1))
    {
        if den != 0.0 {
            value /= den;
            end = den_end;
        }
    }
    Some(Found {
        value: if negative { -value } else { value },
        end,
    })
}

fn sign_allowed(text: &str, i: usize) -> bool {
    text[..i]
        .chars()
        .next_back()
        .is_none_or(|c| !c.is_ascii_alphanumeric() && !")]}".contains(c))
}

/// `\frac{a}{b}`, `\dfrac{a}{b}`, `\tfrac{a}{b}` (each part one number) or `\frac12`
/// at byte `i`.
fn latex_fraction(text: &str, i: usize) -> Option<Found> {
    let rest = &text[i..];
    let body = ["\\frac", "\\dfrac", "\\tfrac"]
        .iter()
        .find_map(|p| rest.strip_prefix(p))?;
    let start = text.len() - body.len();
    let b = body.as_bytes();
    if b.len() >= 2 && b[0].is_ascii_digit() && b[1].is_ascii_digit() {
        let den = f64::from(b[1] - b'0');
        return (den != 0.0).then(|| Found {
            value: f64::from(b[0] - b'0') / den,
            end: start + 2,
        });
    }
    let (num, after) = braced_number(text, start)?;
    let (den, end) = braced_number(text, after)?;
    (den != 0.0).then_some(Found {
        value: num / den,
        end,
    })
}

/// `{number}` at byte `i`: its one number and the byte after the `}`.
fn braced_number(text: &str, i: usize) -> Option<(f64, usize)> {
    let inner = text[i..].strip_prefix('{')?;
    let len = balanced(inner)?;
    let ns = numbers(&inner[..len]);
    match ns.as_slice() {
        [x] => Some((*x, i + 1 + len + 1)),
        _ => None,
    }
}

/// Digits with thousands groups, a decimal part and an exponent, from byte `i`.
fn unsigned(text: &str, i: usize) -> Option<(f64, usize)> {
    let b = text.as_bytes();
    let mut end = digits(b, i);
    let mut plain: String = text[i..end].to_string();
    while end > i && b.get(end) == Some(&b',') && digits(b, end + 1) == end + 4 {
        plain.push_str(&text[end + 1..end + 4]);
        end += 4;
    }
    if b.get(end) == Some(&b'.') && digits(b, end + 1) > end + 1 {
        let frac_end = digits(b, end + 1);
        plain.push_str(&text[end..frac_end]);
        end = frac_end;
    }
    if plain.is_empty() || plain == "." {
        return None;
    }
    if let Some(exp_end) = exponent(b, end) {
        plain.push_str(&text[end..exp_end]);
        end = exp_end;
    }
    Some((plain.parse().ok()?, end))
}

/// The end of `e[+-]digits` at byte `i`, when no letter or digit follows it.
fn exponent(b: &[u8], i: usize) -> Option<usize> {
    if !matches!(b.get(i), Some(b'e' | b'E')) {
        return None;
    }
    let signed = matches!(b.get(i + 1), Some(b'+' | b'-'));
    let start = i + 1 + usize::from(signed);
    let end = digits(b, start);
    let clean = b.get(end).is_none_or(|c| !c.is_ascii_alphanumeric());
    (end > start && clean).then_some(end)
}

fn digits(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_rules() {
        let t = "<answer>1</answer> then <answer> 2 </answer> tail";
        assert_eq!(Extract::AnswerTag.apply(t), Some("2"));
        assert_eq!(
            Extract::AnswerTag.apply("x <answer> 7 and more"),
            Some("7 and more")
        );
        assert_eq!(Extract::AnswerTag.apply("no tag"), None);
        assert_eq!(
            Extract::Boxed.apply(r"\boxed{1} so \boxed{\frac{1}{2}}"),
            Some(r"\frac{1}{2}")
        );
        assert_eq!(Extract::Boxed.apply(r"\boxed{3} \boxed{open"), Some("3"));
        assert_eq!(Extract::Boxed.apply("none"), None);
        assert_eq!(Extract::LastLine.apply("a\n b \n\n  "), Some("b"));
        assert_eq!(Extract::LastLine.apply("  \n"), None);
        assert_eq!(Extract::Completion.apply(""), Some(""));
    }

    #[test]
    fn numbers_in_text() {
        assert_eq!(numbers("I have 3 apples and 12.5 pears"), [3.0, 12.5]);
        assert_eq!(numbers("2-3 = -1"), [2.0, 3.0, -1.0]);
        assert_eq!(numbers("\u{2212}4 and (\u{2212}5)"), [-4.0, -5.0]);
        assert_eq!(numbers("$1,234,567.50 or 1,23"), [1_234_567.5, 1.0, 23.0]);
        assert_eq!(numbers("3/4 of 10, end."), [0.75, 10.0]);
        assert_eq!(numbers("x/0 1/0"), [0.0, 1.0, 0.0]);
        assert_eq!(numbers("v2 item-7 +8 (1)-4"), [2.0, 7.0, 8.0, 1.0, 4.0]);
        assert_eq!(
            numbers("<answer>-64</answer> x=-2 [-3] \"-5\""),
            [-64.0, -2.0, -3.0, -5.0]
        );
        assert_eq!(numbers("no digits"), Vec::<f64>::new());
        // LaTeX fractions, exponents, currency after a sign, a leading point
        assert_eq!(
            numbers(r"\frac{1}{2} -\dfrac{3}{4} \tfrac{-6}{3} \frac12"),
            [0.5, -0.75, -2.0, 0.5]
        );
        assert_eq!(numbers(r"\frac{a}{2} \frac{1}{0}"), [2.0, 1.0, 0.0]);
        assert_eq!(
            numbers("6.02e23 1e-3 3 eggs 2e5x"),
            [6.02e23, 0.001, 3.0, 2.0, 5.0]
        );
        assert_eq!(numbers("-$5 and .5 and -.25"), [-5.0, 0.5, -0.25]);
        assert_eq!(numbers("3/1.5 then 1."), [2.0, 1.0]);
        assert_eq!(
            numbers("\u{7b54}\u{6848}\u{662f}\u{2212}3 x\u{2212}3"),
            [-3.0, 3.0]
        );
    }

    /// No text makes the reader panic or loop: truncated markers, lone signs,
    /// multi-byte characters next to every rule's boundary.
    #[test]
    fn any_text_reads_without_panicking() {
        let nasty = [
            "",
            "\u{2212}",
            "5 \u{2212}",
            "\u{1f389}42\u{1f389}",
            "####",
            "1/",
            "1,",
            "1.",
            "/0",
            "<answer>",
            "</answer><answer>",
            "\\boxed{",
            "\\frac{",
            "\\frac{1}{",
            "\\frac1",
            "-$",
            "$",
            "e5",
            "1e",
            "1e+",
            ".",
            "..5",
            "\u{2212}.\u{2212}",
            "{}}{",
            "\u{ff15}",
        ];
        let long = "\\boxed{".repeat(1000) + &"9".repeat(400);
        for t in nasty.iter().copied().chain([long.as_str()]) {
            let _ = numbers(t);
            let _ = answer_number(t);
            for e in Extract::NAMES {
                let _ = Extract::from_name(e).unwrap().apply(t);
            }
        }
        // too long for an f64: infinite, so never within a tolerance of a reference
        assert_eq!(answer_number(&long), Some(f64::INFINITY));
    }

    #[test]
    fn the_answer_number() {
        // the reasoning's numbers do not count once a marker is there
        assert_eq!(
            answer_number(r"12 + 30 = 42, so \boxed{42}. Check: 7"),
            Some(42.0)
        );
        assert_eq!(answer_number("48/2 = 24\n#### 72\nthanks 5"), Some(72.0));
        assert_eq!(answer_number("so 5 then 6"), Some(6.0));
        assert_eq!(answer_number(r"\boxed{}"), None);
        assert_eq!(answer_number("#### none"), None);
        assert_eq!(answer_number("The answer is \u{2212}3."), Some(-3.0));
        // an empty box falls through to the next rule
        assert_eq!(answer_number("\\boxed{} so #### 72"), Some(72.0));
        assert_eq!(answer_number(r"\boxed{\frac{1}{2}}"), Some(0.5));
    }
}
