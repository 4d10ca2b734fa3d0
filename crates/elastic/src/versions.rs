//! A pipeline's physical indexes are versions of its alias: `<alias>_v<N>`.

/// The index of version `version` of `alias`.
pub fn versioned_index(alias: &str, version: u32) -> String {
    format!("{alias}_v{version}")
}

/// `N` when `index` is `<alias>_v<N>`.
pub fn index_version(alias: &str, index: &str) -> Option<u32> {
    index.strip_prefix(alias)?.strip_prefix("_v")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip() {
        assert_eq!(versioned_index("orders", 3), "orders_v3");
        assert_eq!(index_version("orders", "orders_v3"), Some(3));
        assert_eq!(index_version("orders", "orders_vx"), None);
        assert_eq!(index_version("orders", "order_v3"), None);
    }
}
