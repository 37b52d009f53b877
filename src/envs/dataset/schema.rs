//! The JSON Schema subset the `json_schema` verifier checks answers against. A schema
//! that uses a keyword outside it is refused when the dataset loads (naming the
//! keyword), never silently half-checked.
use serde_json::Value;

/// Keywords that constrain a value.
const CHECKED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "anyOf",
    "allOf",
    "oneOf",
];

/// Keywords that only annotate.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    // an annotation unless a validator opts in to assert it (JSON Schema 2019-09 on)
    "format",
];

/// A schema checked for the subset (its `pattern`s compile).
#[derive(Debug, Clone)]
pub struct Schema(Value);

impl Schema {
    pub fn new(schema: Value) -> anyhow::Result<Self> {
        check_keywords(&schema, "#")?;
        Ok(Self(schema))
    }

    /// Whether `value` satisfies the schema.
    pub fn accepts(&self, value: &Value) -> bool {
        valid(&self.0, value)
    }
}

fn check_keywords(schema: &Value, at: &str) -> anyhow::Result<()> {
    let Some(map) = schema.as_object() else {
        anyhow::ensure!(schema.is_boolean(), "schema at {at} is not an object");
        return Ok(());
    };
    for (k, v) in map {
        let here = format!("{at}/{k}");
        anyhow::ensure!(
            CHECKED.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str()),
            "schema keyword `{k}` at {at} is not supported (supported: {})",
            CHECKED.join(", ")
        );
        match k.as_str() {
            "properties" => {
                let props = v
                    .as_object()
                    .ok_or_else(|| anyhow::anyhow!("{here} must be an object"))?;
                for (name, sub) in props {
                    check_keywords(sub, &format!("{here}/{name}"))?;
                }
            }
            "items" | "additionalProperties" => check_keywords(v, &here)?,
            "anyOf" | "allOf" | "oneOf" => {
                let subs = v
                    .as_array()
                    .ok_or_else(|| anyhow::anyhow!("{here} must be an array"))?;
                for (i, sub) in subs.iter().enumerate() {
                    check_keywords(sub, &format!("{here}/{i}"))?;
                }
            }
            "pattern" => {
                let p = v
                    .as_str()
                    .ok_or_else(|| anyhow::anyhow!("{here} must be a string"))?;
                regex::Regex::new(p).map_err(|e| anyhow::anyhow!("{here}: {e}"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn valid(schema: &Value, v: &Value) -> bool {
    let Some(map) = schema.as_object() else {
        return schema.as_bool().unwrap_or(false);
    };
    map.iter().all(|(k, s)| keyword(k, s, map, v))
}

fn keyword(k: &str, s: &Value, schema: &serde_json::Map<String, Value>, v: &Value) -> bool {
    match k {
        "type" => match s {
            Value::String(t) => is_type(t, v),
            Value::Array(ts) => ts.iter().any(|t| t.as_str().is_some_and(|t| is_type(t, v))),
            _ => false,
        },
        "enum" => s
            .as_array()
            .is_some_and(|opts| opts.iter().any(|o| same(o, v))),
        "const" => same(s, v),
        "anyOf" => subs(s).iter().any(|sub| valid(sub, v)),
        "allOf" => subs(s).iter().all(|sub| valid(sub, v)),
        "oneOf" => subs(s).iter().filter(|sub| valid(sub, v)).count() == 1,
        _ => match v {
            Value::Object(o) => object_keyword(k, s, schema, o),
            Value::Array(a) => array_keyword(k, s, a),
            Value::String(t) => string_keyword(k, s, t),
            Value::Number(n) => number_keyword(k, s, n.as_f64().unwrap_or(f64::NAN)),
            _ => true,
        },
    }
}

fn subs(s: &Value) -> &[Value] {
    s.as_array().map_or(&[], Vec::as_slice)
}

fn is_type(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
        _ => false,
    }
}

/// JSON equality where 1 and 1.0 are the same number.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

fn object_keyword(
    k: &str,
    s: &Value,
    schema: &serde_json::Map<String, Value>,
    o: &serde_json::Map<String, Value>,
) -> bool {
    match k {
        "properties" => s.as_object().is_some_and(|props| {
            props
                .iter()
                .all(|(name, sub)| o.get(name).is_none_or(|x| valid(sub, x)))
        }),
        "required" => subs(s)
            .iter()
            .all(|name| name.as_str().is_some_and(|n| o.contains_key(n))),
        "additionalProperties" => {
            let declared = schema.get("properties").and_then(Value::as_object);
            o.iter()
                .filter(|(name, _)| declared.is_none_or(|d| !d.contains_key(*name)))
                .all(|(_, x)| valid(s, x))
        }
        _ => true,
    }
}

fn array_keyword(k: &str, s: &Value, a: &[Value]) -> bool {
    match k {
        "items" => a.iter().all(|x| valid(s, x)),
        "minItems" => s.as_u64().is_some_and(|n| a.len() as u64 >= n),
        "maxItems" => s.as_u64().is_some_and(|n| a.len() as u64 <= n),
        _ => true,
    }
}

fn string_keyword(k: &str, s: &Value, t: &str) -> bool {
    let chars = t.chars().count() as u64;
    match k {
        "minLength" => s.as_u64().is_some_and(|n| chars >= n),
        "maxLength" => s.as_u64().is_some_and(|n| chars <= n),
        // compiled once at load to check it; again here (schemas are small, answers few)
        "pattern" => s
            .as_str()
            .and_then(|p| regex::Regex::new(p).ok())
            .is_some_and(|re| re.is_match(t)),
        _ => true,
    }
}

fn number_keyword(k: &str, s: &Value, x: f64) -> bool {
    let Some(bound) = s.as_f64() else {
        return true;
    };
    match k {
        "minimum" => x >= bound,
        "maximum" => x <= bound,
        "exclusiveMinimum" => x > bound,
        "exclusiveMaximum" => x < bound,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Schema {
        Schema::new(v).unwrap()
    }

    #[test]
    fn objects_and_their_properties() {
        let s = schema(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "pattern": "^[A-Z]"},
                "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
            },
            "required": ["name", "age"],
            "additionalProperties": false
        }));
        assert!(s.accepts(&json!({"name": "Ada", "age": 36})));
        assert!(s.accepts(&json!({"name": "Ada", "age": 36.0, "tags": ["a"]})));
        assert!(!s.accepts(&json!({"name": "Ada"})), "required");
        assert!(!s.accepts(&json!({"name": "ada", "age": 1})), "pattern");
        assert!(!s.accepts(&json!({"name": "", "age": 1})), "minLength");
        assert!(!s.accepts(&json!({"name": "A", "age": 1.5})), "integer");
        assert!(
            !s.accepts(&json!({"name": "A", "age": 150})),
            "exclusiveMaximum"
        );
        assert!(!s.accepts(&json!({"name": "A", "age": -1})), "minimum");
        assert!(
            !s.accepts(&json!({"name": "A", "age": 1, "x": 0})),
            "additional"
        );
        assert!(
            !s.accepts(&json!({"name": "A", "age": 1, "tags": ["c"]})),
            "enum"
        );
        assert!(!s.accepts(&json!({"name": "A", "age": 1, "tags": ["a", "a", "b"]})));
        assert!(!s.accepts(&json!(["name", "age"])), "type");
    }

    #[test]
    fn combinators_and_constants() {
        let s = schema(json!({"oneOf": [{"type": "integer"}, {"minimum": 10}]}));
        assert!(s.accepts(&json!(3)));
        assert!(s.accepts(&json!(10.5)));
        assert!(!s.accepts(&json!(12)), "both match: not one");
        let s = schema(json!({"anyOf": [{"const": "x"}, {"type": ["null", "boolean"]}]}));
        assert!(s.accepts(&json!("x")) && s.accepts(&json!(null)) && s.accepts(&json!(true)));
        assert!(!s.accepts(&json!("y")));
        let s = schema(json!({"allOf": [{"type": "string"}, {"maxLength": 2}]}));
        assert!(
            s.accepts(&json!("\u{e9}\u{e9}")),
            "length counts characters"
        );
        assert!(!s.accepts(&json!("abc")));
        assert!(schema(json!(true)).accepts(&json!(1)));
        assert!(!schema(json!(false)).accepts(&json!(1)));
    }

    #[test]
    fn unsupported_keywords_are_refused_by_name() {
        let e = Schema::new(json!({"properties": {"a": {"$ref": "#/x"}}})).unwrap_err();
        assert!(e.to_string().contains("`$ref` at #/properties/a"), "{e}");
        let e = Schema::new(json!({"pattern": "("})).unwrap_err();
        assert!(e.to_string().contains("#/pattern"), "{e}");
        assert!(Schema::new(json!("object")).is_err());
        assert!(Schema::new(json!({"title": "t", "type": "object"})).is_ok());
    }
}
