//! Expression trees over the puzzle's numbers, as the generator, the solver and the
//! scripted policies build them, and how they are written in an answer.

use super::rat::Rat;

/// A binary operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Add, Op::Sub, Op::Mul, Op::Div];

    /// `a op b` exactly; `None` on overflow or division by zero.
    pub fn apply(self, a: Rat, b: Rat) -> Option<Rat> {
        match self {
            Op::Add => a.checked_add(b),
            Op::Sub => a.checked_sub(b),
            Op::Mul => a.checked_mul(b),
            Op::Div => a.checked_div(b),
        }
    }

    pub fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
            Op::Mul => '*',
            Op::Div => '/',
        }
    }

    fn precedence(self) -> u8 {
        match self {
            Op::Add | Op::Sub => 1,
            Op::Mul | Op::Div => 2,
        }
    }

    /// Whether `a op (b op' c)` needs its parentheses when `op'` binds as tightly.
    fn right_sensitive(self) -> bool {
        matches!(self, Op::Sub | Op::Div)
    }
}

/// An expression over positive integers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Num(u32),
    Bin(Op, Box<Expr>, Box<Expr>),
}

impl Expr {
    pub fn bin(op: Op, a: Expr, b: Expr) -> Expr {
        Expr::Bin(op, Box::new(a), Box::new(b))
    }

    /// The exact value; `None` on overflow or division by zero.
    pub fn eval(&self) -> Option<Rat> {
        match self {
            Expr::Num(n) => Some(Rat::int(i128::from(*n))),
            Expr::Bin(op, a, b) => op.apply(a.eval()?, b.eval()?),
        }
    }

    /// The numbers in the expression, left to right.
    pub fn leaves(&self) -> Vec<u32> {
        match self {
            Expr::Num(n) => vec![*n],
            Expr::Bin(_, a, b) => {
                let mut v = a.leaves();
                v.extend(b.leaves());
                v
            }
        }
    }

    fn precedence(&self) -> u8 {
        match self {
            Expr::Num(_) => 3,
            Expr::Bin(op, _, _) => op.precedence(),
        }
    }
}

/// Infix with only the parentheses the value needs (`(1 + 2) * 3`, `8 - (3 - 1)`);
/// dropped ones never change the exact value (`a * (b / c)` is written `a * b / c`).
impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expr::Num(n) => write!(f, "{n}"),
            Expr::Bin(op, a, b) => write_bin(f, *op, a, b),
        }
    }
}

fn write_bin(f: &mut std::fmt::Formatter<'_>, op: Op, a: &Expr, b: &Expr) -> std::fmt::Result {
    let p = op.precedence();
    if a.precedence() < p {
        write!(f, "({a})")?;
    } else {
        write!(f, "{a}")?;
    }
    write!(f, " {} ", op.symbol())?;
    let rp = b.precedence();
    if rp < p || (rp == p && op.right_sensitive()) {
        write!(f, "({b})")
    } else {
        write!(f, "{b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_only_needed_parentheses() {
        use Expr::Num;
        let e = Expr::bin(Op::Mul, Expr::bin(Op::Add, Num(1), Num(2)), Num(3));
        assert_eq!(e.to_string(), "(1 + 2) * 3");
        let e = Expr::bin(Op::Sub, Num(8), Expr::bin(Op::Sub, Num(3), Num(1)));
        assert_eq!(e.to_string(), "8 - (3 - 1)");
        let e = Expr::bin(Op::Add, Num(8), Expr::bin(Op::Sub, Num(3), Num(1)));
        assert_eq!(e.to_string(), "8 + 3 - 1");
        let e = Expr::bin(Op::Div, Num(8), Expr::bin(Op::Mul, Num(2), Num(2)));
        assert_eq!(e.to_string(), "8 / (2 * 2)");
        assert_eq!(e.eval(), Some(Rat::int(2)));
        assert_eq!(e.leaves(), [8, 2, 2]);
    }
}
