//! Exact rationals over `i128` with checked arithmetic: every operation returns `None`
//! on overflow or division by zero instead of wrapping or panicking, so a value built
//! from model text can never crash the checker or be silently wrong.

/// A reduced fraction `num / den` with `den > 0` and `gcd(|num|, den) = 1`, so equal
/// values have equal representations (`==` and `Hash` are value equality).
///
/// The derived `Ord` compares `(num, den)` lexicographically, not by value: it is only
/// used to sort values into a canonical order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rat {
    num: i128,
    den: i128,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rat {
    /// The integer `n`.
    pub fn int(n: i128) -> Rat {
        Rat { num: n, den: 1 }
    }

    /// `num / den` reduced; `None` when `den` is 0 or the result does not fit.
    pub fn new(num: i128, den: i128) -> Option<Rat> {
        if den == 0 {
            return None;
        }
        let g = gcd(num.unsigned_abs(), den.unsigned_abs());
        let Ok(g) = i128::try_from(g) else {
            // A gcd of 2^127 means den == i128::MIN and num is 0 or i128::MIN.
            return Some(Rat::int(i128::from(num != 0)));
        };
        let (num, den) = (num / g, den / g);
        if den < 0 {
            Some(Rat {
                num: num.checked_neg()?,
                den: den.checked_neg()?,
            })
        } else {
            Some(Rat { num, den })
        }
    }

    pub fn checked_add(self, o: Rat) -> Option<Rat> {
        // Scale by the lcm of the denominators, not their product, to delay overflow.
        let g = gcd(self.den as u128, o.den as u128) as i128;
        let left = self.num.checked_mul(o.den / g)?;
        let right = o.num.checked_mul(self.den / g)?;
        Rat::new(left.checked_add(right)?, self.den.checked_mul(o.den / g)?)
    }

    pub fn checked_sub(self, o: Rat) -> Option<Rat> {
        self.checked_add(Rat {
            num: o.num.checked_neg()?,
            den: o.den,
        })
    }

    pub fn checked_mul(self, o: Rat) -> Option<Rat> {
        // Cross-reduce first so products of reduced fractions overflow only when the
        // result itself does not fit.
        let g1 = gcd(self.num.unsigned_abs(), o.den as u128) as i128;
        let g2 = gcd(o.num.unsigned_abs(), self.den as u128) as i128;
        let num = (self.num / g1).checked_mul(o.num / g2)?;
        let den = (self.den / g2).checked_mul(o.den / g1)?;
        Rat::new(num, den)
    }

    /// `None` when `o` is zero.
    pub fn checked_div(self, o: Rat) -> Option<Rat> {
        if o.num == 0 {
            return None;
        }
        self.checked_mul(Rat::new(o.den, o.num)?)
    }

    /// The value as an integer, if it is one.
    pub fn as_int(self) -> Option<i128> {
        (self.den == 1).then_some(self.num)
    }
}

impl std::fmt::Display for Rat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: i128, d: i128) -> Rat {
        Rat::new(n, d).unwrap()
    }

    #[test]
    fn arithmetic_is_exact_and_reduced() {
        assert_eq!(r(2, 4), r(1, 2));
        assert_eq!(r(1, -2), r(-1, 2));
        assert_eq!(r(1, 3).checked_add(r(1, 6)), Some(r(1, 2)));
        assert_eq!(r(1, 3).checked_sub(r(1, 3)), Some(Rat::int(0)));
        assert_eq!(r(2, 3).checked_mul(r(9, 4)), Some(r(3, 2)));
        assert_eq!(r(1, 3).checked_div(r(1, 9)), Some(Rat::int(3)));
        assert_eq!(Rat::int(1).checked_div(Rat::int(0)), None);
        assert_eq!(Rat::new(1, 0), None);
        assert_eq!(r(7, 1).as_int(), Some(7));
        assert_eq!(r(7, 2).as_int(), None);
    }

    #[test]
    fn overflow_is_none_not_a_panic() {
        let big = Rat::int(i128::MAX);
        assert_eq!(big.checked_add(Rat::int(1)), None);
        assert_eq!(big.checked_mul(Rat::int(2)), None);
        assert_eq!(Rat::int(i128::MIN).checked_sub(Rat::int(1)), None);
        assert_eq!(Rat::new(i128::MIN, -1), None);
        assert_eq!(Rat::new(i128::MIN, i128::MIN), Some(Rat::int(1)));
        assert_eq!(Rat::new(0, i128::MIN), Some(Rat::int(0)));
        assert_eq!(Rat::int(1).checked_div(Rat::int(i128::MIN)), None);
        assert_eq!(big.checked_div(big), Some(Rat::int(1)));
    }
}
