//! The answer checker: a pure function of the completion text and the puzzle.

use super::expr::Op;
use super::rat::Rat;

/// What the checker made of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Uses the numbers exactly and equals the target.
    Correct,
    /// No `<answer>` tag.
    NoAnswer,
    /// The answer is not an expression of the accepted grammar (the reason).
    Unparseable(&'static str),
    /// Parsed, the numbers are right, but evaluating it overflows or divides by zero.
    Undefined,
    /// Parsed, but the numbers used are not exactly the puzzle's.
    WrongNumbers,
    /// Parsed, the numbers are right, but the value is not the target.
    WrongValue,
}

impl Verdict {
    /// The answer parsed as an expression.
    pub fn format(self) -> bool {
        !matches!(self, Verdict::NoAnswer | Verdict::Unparseable(_))
    }

    pub fn correct(self) -> bool {
        self == Verdict::Correct
    }

    /// TinyZero's scheme: 1.0 correct, 0.1 well-formed but wrong, 0.0 otherwise.
    pub fn scalar(self) -> f64 {
        if self.correct() {
            1.0
        } else if self.format() {
            0.1
        } else {
            0.0
        }
    }

    /// A short description (the feedback when the format failed).
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Correct => "correct",
            Verdict::NoAnswer => "no <answer> tag",
            Verdict::Unparseable(why) => why,
            Verdict::Undefined => "division by zero or a number too large",
            Verdict::WrongNumbers => "does not use each given number exactly once",
            Verdict::WrongValue => "does not equal the target",
        }
    }
}

/// Check a completion against a puzzle. The exact rules:
///
/// 1. **The answer**: the text after the *last* `<answer>` (tags are case-sensitive), up
///    to the first `</answer>` after it, or to the end of the text when it is not
///    closed. Everything else (reasoning, numbers in `<think>`, earlier answers, text
///    after `</answer>`) is ignored. No `<answer>`: [`Verdict::NoAnswer`].
/// 2. **Grammar** (whitespace allowed around every token, including the ends):
///    `answer = expr [ "=" integer ]`, `expr = term { ("+" | "-") term }`,
///    `term = factor { ("*" | "/") factor }`, `factor = integer | "(" expr ")"`;
///    integers are ASCII digit runs (leading zeros allowed: `07` is 7). `−` (U+2212)
///    is read as `-`, `×` and `·` as `*`, `÷` as `/`. The number after a trailing `=`
///    is ignored (it need not be the target). **Unary minus (or plus) is not allowed**:
///    `-3 + 5` does not parse. Decimals, variables, other characters, parentheses
///    nested over 64 deep, and anything left over: [`Verdict::Unparseable`] (format 0).
/// 3. **Numbers**: the integers of the expression (not the one after `=`) must be
///    exactly the multiset of the puzzle's numbers, each used once and all used, else
///    [`Verdict::WrongNumbers`].
/// 4. **Value**: evaluated left to right with the usual precedence, in exact rationals
///    (`(1 / 3) * 3` is 1); an overflow of i128 anywhere (a literal included) or a
///    division by zero is [`Verdict::Undefined`]; a value other than `target` is
///    [`Verdict::WrongValue`]; otherwise [`Verdict::Correct`].
///
/// Never panics; linear in the text's length.
pub fn check_answer(text: &str, numbers: &[u32], target: u32) -> Verdict {
    let Some(span) = answer_span(text) else {
        return Verdict::NoAnswer;
    };
    let parsed = match parse(span) {
        Ok(p) => p,
        Err(why) => return Verdict::Unparseable(why),
    };
    let mut used = parsed.literals;
    used.sort_unstable();
    let mut want: Vec<Option<i128>> = numbers.iter().map(|&n| Some(i128::from(n))).collect();
    want.sort_unstable();
    if used != want {
        return Verdict::WrongNumbers;
    }
    match parsed.value {
        None => Verdict::Undefined,
        Some(v) if v == Rat::int(i128::from(target)) => Verdict::Correct,
        Some(_) => Verdict::WrongValue,
    }
}

/// The text of the last `<answer>` (see [`check_answer`], rule 1).
pub fn answer_span(text: &str) -> Option<&str> {
    const OPEN: &str = "<answer>";
    let rest = &text[text.rfind(OPEN)? + OPEN.len()..];
    Some(rest.find("</answer>").map_or(rest, |end| &rest[..end]))
}

/// A parsed answer: its value (`None`: overflow or division by zero) and its integer
/// literals in order (`None`: a literal too large for i128).
struct Parsed {
    value: Option<Rat>,
    literals: Vec<Option<i128>>,
}

/// Parentheses nested deeper than this are rejected, which bounds the recursion.
const MAX_DEPTH: usize = 64;

fn parse(span: &str) -> Result<Parsed, &'static str> {
    let mut p = Parser {
        chars: span.chars().peekable(),
        depth: 0,
        literals: Vec::new(),
    };
    let value = p.expr()?;
    p.skip_ws();
    if p.eat('=') {
        p.skip_ws();
        if !p.at_digit() {
            return Err("`=` must be followed by a number");
        }
        p.number();
        p.skip_ws();
    }
    if p.chars.peek().is_some() {
        return Err("unexpected text after the expression");
    }
    Ok(Parsed {
        value,
        literals: p.literals,
    })
}

/// A recursive-descent parser that evaluates as it goes (no tree, so a long flat
/// expression cannot deepen the stack).
struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    depth: usize,
    literals: Vec<Option<i128>>,
}

fn combine(op: Op, a: Option<Rat>, b: Option<Rat>) -> Option<Rat> {
    op.apply(a?, b?)
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.chars.next_if(|c| c.is_whitespace()).is_some() {}
    }

    fn eat(&mut self, c: char) -> bool {
        self.chars.next_if_eq(&c).is_some()
    }

    fn at_digit(&mut self) -> bool {
        self.chars.peek().is_some_and(char::is_ascii_digit)
    }

    /// The digit run here (call only `at_digit`); `None` if it overflows i128.
    fn number(&mut self) -> Option<i128> {
        let mut n: Option<i128> = Some(0);
        while let Some(d) = self.chars.next_if(char::is_ascii_digit) {
            let digit = i128::from(d as u8 - b'0');
            n = n.and_then(|n| n.checked_mul(10)?.checked_add(digit));
        }
        n
    }

    /// Consume the next operator if it is one of the level's (`additive` or not).
    fn operator(&mut self, additive: bool) -> Option<Op> {
        self.skip_ws();
        let op = match (additive, self.chars.peek()?) {
            (true, '+') => Op::Add,
            (true, '-' | '\u{2212}') => Op::Sub,
            (false, '*' | '×' | '·') => Op::Mul,
            (false, '/' | '÷') => Op::Div,
            _ => return None,
        };
        self.chars.next();
        Some(op)
    }

    fn expr(&mut self) -> Result<Option<Rat>, &'static str> {
        let mut acc = self.term()?;
        while let Some(op) = self.operator(true) {
            acc = combine(op, acc, self.term()?);
        }
        Ok(acc)
    }

    fn term(&mut self) -> Result<Option<Rat>, &'static str> {
        let mut acc = self.factor()?;
        while let Some(op) = self.operator(false) {
            acc = combine(op, acc, self.factor()?);
        }
        Ok(acc)
    }

    fn factor(&mut self) -> Result<Option<Rat>, &'static str> {
        self.skip_ws();
        if self.at_digit() {
            let n = self.number();
            self.literals.push(n);
            return Ok(n.map(Rat::int));
        }
        match self.chars.next() {
            Some('(') if self.depth < MAX_DEPTH => {
                self.depth += 1;
                let v = self.expr()?;
                self.depth -= 1;
                self.skip_ws();
                if self.eat(')') {
                    Ok(v)
                } else {
                    Err("unbalanced parentheses")
                }
            }
            Some('(') => Err("parentheses nested too deeply"),
            Some('-' | '\u{2212}' | '+') => Err("a sign before a number is not allowed"),
            Some(_) => Err("expected a number or `(`"),
            None => Err("the expression is empty or ends early"),
        }
    }
}
