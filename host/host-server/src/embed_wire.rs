//! `POST /v1/embeddings` bodies as OpenAI defines them: `input` (a string,
//! strings, token ids, or lists of token ids), `encoding_format` (`float`
//! or `base64`: little-endian f32 bytes), `dimensions` (Matryoshka: the
//! first n components). Each wrong value is a 400 naming its parameter.

use crate::error::ApiError;
use crate::wire::Fields;
use serde_json::Value;

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// One input as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedBody {
    pub inputs: Vec<Input>,
    pub encoding: Encoding,
    pub dimensions: Option<usize>,
}

fn input_error(message: impl Into<String>) -> ApiError {
    ApiError::param("input", message)
}

fn token_ids(a: &[Value]) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|x| {
            x.as_u64()
                .filter(|n| *n < u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| input_error("token ids must be non-negative integers"))
        })
        .collect()
}

fn inputs(v: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    const SHAPE: &str =
        "`input` must be a string, an array of strings, an array of token ids, or an array of arrays of token ids";
    let out = match v {
        None => return Err(input_error("`input` is required")),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(input_error("`input` must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Input::Ids(token_ids(a)?)],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().filter_map(Value::as_str).map(|s| Input::Text(s.to_owned())).collect()
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => {
            a.iter().filter_map(Value::as_array).map(|ids| token_ids(ids).map(Input::Ids)).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(input_error(SHAPE)),
    };
    if out.len() > MAX_INPUTS {
        return Err(input_error(format!("`input` takes at most {MAX_INPUTS} items, got {}", out.len())));
    }
    let empty = |i: &Input| match i {
        Input::Text(s) => s.is_empty(),
        Input::Ids(ids) => ids.is_empty(),
    };
    if let Some(n) = out.iter().position(empty) {
        return Err(input_error(format!("input {n} is empty")));
    }
    Ok(out)
}

impl EmbedBody {
    pub fn parse(f: &Fields) -> Result<Self, ApiError> {
        let encoding = match f.value("encoding_format") {
            None => Encoding::Float,
            Some(Value::String(s)) if s == "float" => Encoding::Float,
            Some(Value::String(s)) if s == "base64" => Encoding::Base64,
            Some(_) => return Err(ApiError::param("encoding_format", "`encoding_format` must be `float` or `base64`")),
        };
        let dimensions = match f.integer("dimensions")? {
            None => None,
            Some(n) if n >= 1 => Some(n as usize),
            Some(n) => return Err(ApiError::param("dimensions", format!("`dimensions` must be at least 1, got {n}"))),
        };
        Ok(Self { inputs: inputs(f.value("input"))?, encoding, dimensions })
    }
}

/// A vector as the response carries it.
pub fn encode(v: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => Value::from(v.iter().map(|&x| Value::from(x)).collect::<Vec<_>>()),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::encode(bytes))
        }
    }
}

/// Matryoshka truncation: the first `n` components, renormalised when the
/// model's vectors are unit-length (a prefix of a unit vector is not).
pub fn truncate(v: &mut Vec<f32>, n: usize, renormalize: bool) {
    v.truncate(n);
    if renormalize {
        host_engine::embed::normalize(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<EmbedBody, ApiError> {
        EmbedBody::parse(&Fields(v.as_object().unwrap()))
    }

    #[test]
    fn every_input_shape_openai_allows_is_read() {
        let text = |s: &str| Input::Text(s.into());
        assert_eq!(parse(json!({"input": "a"})).unwrap().inputs, vec![text("a")]);
        assert_eq!(parse(json!({"input": ["a", "b"]})).unwrap().inputs, vec![text("a"), text("b")]);
        assert_eq!(parse(json!({"input": [1, 2]})).unwrap().inputs, vec![Input::Ids(vec![1, 2])]);
        assert_eq!(
            parse(json!({"input": [[1], [2, 3]]})).unwrap().inputs,
            vec![Input::Ids(vec![1]), Input::Ids(vec![2, 3])]
        );
    }

    #[test]
    fn bad_bodies_name_their_parameter() {
        for (body, param) in [
            (json!({}), "input"),
            (json!({"input": ""}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": ["a", 1]}), "input"),
            (json!({"input": [[1], []]}), "input"),
            (json!({"input": [-1]}), "input"),
            (json!({"input": {"a": 1}}), "input"),
            (json!({"input": "a", "encoding_format": "hex"}), "encoding_format"),
            (json!({"input": "a", "dimensions": 0}), "dimensions"),
            (json!({"input": "a", "dimensions": "8"}), "dimensions"),
        ] {
            let e = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let v = encode(&[1.0, -2.5], Encoding::Base64);
        let bytes = base64::decode(v.as_str().unwrap()).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat());
    }

    #[test]
    fn truncation_renormalises_unit_vectors() {
        let mut v = vec![0.6, 0.0, 0.8];
        truncate(&mut v, 2, true);
        assert_eq!(v, vec![1.0, 0.0]);
        let mut v = vec![3.0, 4.0, 5.0];
        truncate(&mut v, 2, false);
        assert_eq!(v, vec![3.0, 4.0]);
    }
}
