//! Enums carried by name — in the meta database, the coordination records, the API's
//! string fields, metrics' labels — get their names from one table each.

/// Gives a fieldless enum its names: `ALL` (every value, in order), `as_str`, `parse`
/// (the inverse of `as_str`) and a `Display` that writes the name.
macro_rules! named {
    ($ty:ident { $($v:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$v),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$v => $name,)+
                }
            }

            /// The value `name` names (as `as_str` writes it).
            pub fn parse(name: &str) -> Option<$ty> {
                $ty::ALL.into_iter().find(|v| v.as_str() == name)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use named;

#[cfg(test)]
mod tests {
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Tide {
        High,
        Low,
    }

    named!(Tide { High => "high", Low => "low water" });

    #[test]
    fn every_value_reads_back_from_its_name() {
        assert_eq!(Tide::ALL, [Tide::High, Tide::Low]);
        for t in Tide::ALL {
            assert_eq!(Tide::parse(t.as_str()), Some(t));
        }
        assert_eq!(Tide::Low.to_string(), "low water");
        assert_eq!(Tide::parse("ebb"), None);
    }
}
