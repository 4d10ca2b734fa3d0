//! A pipeline spec as text, the way operators write it (README, "Pipeline spec"): TOML,
//! or JSON when it starts with `{`. Read by `sluicectl pipelines put --spec` and by the
//! console's spec editor through the center; written back for the editor's text view.

use serde_json::Value;
use sluice_model::PipelineSpec;

/// Reads a spec from `text`; the error names the key at fault (`relations[0].on`) when
/// the text parses but does not fit a spec.
pub fn parse(text: &str) -> Result<PipelineSpec, SpecTextError> {
    let value: Value = if is_json(text) {
        serde_json::from_str(text).map_err(|e| SpecTextError {
            key: String::new(),
            message: format!("not JSON: {e}"),
        })?
    } else {
        let table: toml::Table = toml::from_str(text).map_err(|e| SpecTextError {
            key: String::new(),
            message: format!("not TOML: {}", e.message()),
        })?;
        serde_json::to_value(table).map_err(|e| SpecTextError {
            key: String::new(),
            message: e.to_string(),
        })?
    };
    serde_path_to_error::deserialize(value).map_err(|e| SpecTextError {
        key: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

/// Whether `text` is a spec in JSON (else TOML).
pub fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

/// `spec` as TOML.
pub fn to_toml(spec: &PipelineSpec) -> Result<String, String> {
    let table = toml::Table::try_from(spec).map_err(|e| e.to_string())?;
    Ok(table.to_string())
}

/// `spec` as JSON, indented.
pub fn to_json(spec: &PipelineSpec) -> String {
    serde_json::to_string_pretty(spec).unwrap_or_default()
}

/// Why a text is no spec, and where (`key` empty: the text as a whole).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecTextError {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for SpecTextError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() || self.key == "." {
            f.write_str(&self.message)
        } else {
            write!(f, "`{}`: {}", self.key, self.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_reads_back_from_its_toml_and_its_json() {
        let text = r#"
name = "products"
source = "shop"
database = "shop"
table = "products"
[[relations]]
name = "brand"
kind = "one_to_one"
table = "brands"
on = { brand_id = "id" }
"#;
        let spec = parse(text).unwrap();
        assert_eq!(spec.relations[0].name, "brand");
        assert_eq!(parse(&to_toml(&spec).unwrap()).unwrap(), spec);
        assert_eq!(parse(&to_json(&spec)).unwrap(), spec);
    }

    #[test]
    fn a_spec_that_does_not_fit_names_the_key() {
        let e = parse(r#"{"name": "p", "relations": [{"name": "b", "kind": "sideways"}]}"#)
            .unwrap_err();
        assert_eq!(e.key, "relations[0].kind", "{e}");
        let e = parse("name = ").unwrap_err();
        assert!(e.message.starts_with("not TOML"), "{e}");
    }
}
