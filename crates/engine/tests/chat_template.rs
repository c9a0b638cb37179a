//! Chat templates rendered byte for byte like transformers (goldens from
//! scripts/reference/make_template_goldens.py).

use std::path::Path;

use redlite_engine::chat::{ChatMessage, ChatTemplate, RenderOptions};
use redlite_engine::vocab::{QWEN3_CHAT_TEMPLATE, QWEN3_CODER_CHAT_TEMPLATE};

fn check_goldens(file: &str, source: &str) -> usize {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden/templates")
        .join(file);
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read golden")).expect("json");
    let template = ChatTemplate::new(source).expect("compile template");
    let cases = golden["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let messages: Vec<ChatMessage> =
            serde_json::from_value(case["messages"].clone()).expect("messages");
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().expect("agp"),
            enable_thinking: case["enable_thinking"].as_bool(),
            tools: case["tools"].as_array().cloned(),
        };
        let result = template.render(&messages, &options);
        match (case.get("rendered").and_then(|r| r.as_str()), result) {
            (Some(expected), Ok(got)) if got == expected => {}
            (Some(expected), Ok(got)) => failures.push(format!(
                "{name}: rendering differs\n--- transformers\n{expected}\n--- redlite\n{got}"
            )),
            (Some(_), Err(e)) => failures.push(format!("{name}: error {e}")),
            (None, Ok(got)) => failures.push(format!(
                "{name}: transformers refused ({}), redlite rendered\n{got}",
                case["error"]
            )),
            (None, Err(_)) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{file}: {}/{} cases fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

#[test]
fn chat_template_qwen3_matches_transformers() {
    assert!(check_goldens("qwen3.json", QWEN3_CHAT_TEMPLATE) >= 15);
}

#[test]
fn chat_template_qwen3_coder_matches_transformers() {
    assert!(check_goldens("qwen3_coder.json", QWEN3_CODER_CHAT_TEMPLATE) >= 15);
}
