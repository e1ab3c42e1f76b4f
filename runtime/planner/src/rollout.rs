//! `rollout.maxUnavailable` → how many nodes of a group may be worked on at once.
//!
//! Rule (documented in docs/api.md): an integer `n` means `n`; a percentage `p%` means
//! `floor(group size × p / 100)`; either way the result is at least 1 (so a rollout always
//! makes progress) and at most the group size (for a non-empty group). A string of digits
//! (`"3"`) means the integer. Control-plane nodes ignore this: always one at a time.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A `maxUnavailable` the planner cannot use. The CRD schema refuses these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaxUnavailableError {
    #[error(
        "rollout.maxUnavailable must be a positive integer or a percentage from 1% to 100%, found {found:?}: fix the Operation"
    )]
    Invalid { found: String },
}

/// A parsed `maxUnavailable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnavailable {
    Count(u32),
    Percent(u32),
}

impl MaxUnavailable {
    /// Parses the API value.
    pub fn parse(value: &IntOrString) -> Result<Self, MaxUnavailableError> {
        let invalid = || MaxUnavailableError::Invalid {
            found: match value {
                IntOrString::Int(i) => i.to_string(),
                IntOrString::String(s) => s.clone(),
            },
        };
        match value {
            IntOrString::Int(i) => u32::try_from(*i)
                .ok()
                .filter(|n| *n >= 1)
                .map(MaxUnavailable::Count)
                .ok_or_else(invalid),
            IntOrString::String(s) => {
                let (digits, percent) = match s.strip_suffix('%') {
                    Some(d) => (d, true),
                    None => (s.as_str(), false),
                };
                if digits.is_empty()
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                    || digits.starts_with('0')
                {
                    return Err(invalid());
                }
                let n: u32 = digits.parse().map_err(|_| invalid())?;
                if percent {
                    if n > 100 {
                        return Err(invalid());
                    }
                    Ok(MaxUnavailable::Percent(n))
                } else {
                    Ok(MaxUnavailable::Count(n))
                }
            }
        }
    }

    /// How many of `group_size` nodes may be worked on at once: at least 1, at most the
    /// group size (when the group is not empty).
    pub fn resolve(self, group_size: usize) -> u32 {
        let size = u32::try_from(group_size).unwrap_or(u32::MAX);
        let raw = match self {
            MaxUnavailable::Count(n) => n,
            // u64 so that size × 100 cannot overflow.
            MaxUnavailable::Percent(p) => {
                u32::try_from(u64::from(size) * u64::from(p) / 100).unwrap_or(u32::MAX)
            }
        };
        raw.min(size).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> IntOrString {
        IntOrString::String(v.into())
    }

    #[test]
    fn parses_what_the_schema_accepts() {
        assert_eq!(
            MaxUnavailable::parse(&IntOrString::Int(3)),
            Ok(MaxUnavailable::Count(3))
        );
        assert_eq!(MaxUnavailable::parse(&s("3")), Ok(MaxUnavailable::Count(3)));
        assert_eq!(
            MaxUnavailable::parse(&s("25%")),
            Ok(MaxUnavailable::Percent(25))
        );
        assert_eq!(
            MaxUnavailable::parse(&s("100%")),
            Ok(MaxUnavailable::Percent(100))
        );
        assert_eq!(
            MaxUnavailable::parse(&s("1%")),
            Ok(MaxUnavailable::Percent(1))
        );
    }

    #[test]
    fn refuses_what_the_schema_refuses() {
        for bad in [
            s("0"),
            s("0%"),
            s("101%"),
            s("05%"),
            s("%"),
            s(""),
            s("-1"),
            s("2.5%"),
            s("ten"),
            IntOrString::Int(0),
            IntOrString::Int(-2),
        ] {
            let err = MaxUnavailable::parse(&bad).unwrap_err();
            assert!(
                err.to_string().contains("positive integer or a percentage"),
                "{err}"
            );
        }
    }

    #[test]
    fn percentages_round_down_with_a_floor_of_one() {
        assert_eq!(MaxUnavailable::Percent(25).resolve(10), 2); // 2.5 → 2
        assert_eq!(MaxUnavailable::Percent(25).resolve(3), 1); // 0.75 → floor 1
        assert_eq!(MaxUnavailable::Percent(50).resolve(7), 3);
        assert_eq!(MaxUnavailable::Percent(100).resolve(7), 7);
        assert_eq!(MaxUnavailable::Percent(1).resolve(1000), 10);
        assert_eq!(MaxUnavailable::Count(5).resolve(3), 3);
        assert_eq!(MaxUnavailable::Count(2).resolve(10), 2);
        assert_eq!(MaxUnavailable::Count(2).resolve(0), 1);
    }

    /// Every group size up to 500 and every percentage: the result equals the documented
    /// formula, stays in [1, max(size, 1)], and never decreases as the percentage grows.
    #[test]
    fn percent_rule_holds_for_every_size_and_percentage() {
        for size in 0..=500usize {
            let mut previous = 0;
            for p in 1..=100u32 {
                let got = MaxUnavailable::Percent(p).resolve(size);
                let formula = ((size as u64 * p as u64) / 100)
                    .max(1)
                    .min(size.max(1) as u64) as u32;
                assert_eq!(got, formula, "size {size}, {p}%");
                assert!(
                    got >= 1 && got as usize <= size.max(1),
                    "size {size}, {p}% gave {got}"
                );
                assert!(
                    got >= previous,
                    "size {size}: {p}% gave {got}, less than {previous} for a smaller percentage"
                );
                previous = got;
            }
            assert_eq!(
                MaxUnavailable::Percent(100).resolve(size) as usize,
                size.max(1)
            );
        }
    }

    #[test]
    fn count_rule_holds_for_every_size_and_count() {
        for size in 0..=200usize {
            for n in 1..=250u32 {
                let got = MaxUnavailable::Count(n).resolve(size);
                assert_eq!(
                    got as usize,
                    (n as usize).min(size).max(1),
                    "size {size}, count {n}"
                );
            }
        }
    }
}
