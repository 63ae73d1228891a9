//! What an upload is when it is not what was asked, in a line a person can act on: not
//! WebAssembly (and what it looks like instead), a core module where a component is needed,
//! or a component of another policy kind.

use super::runtime::Kind;

const MAGIC: &[u8; 4] = b"\0asm";
/// The version and layer words of a core module and of a component.
const CORE_MODULE: [u8; 4] = [1, 0, 0, 0];
const COMPONENT: [u8; 4] = [0x0d, 0, 1, 0];
/// A refusal quotes at most this much of a compiler's message.
const MAX_DETAIL_BYTES: usize = 300;

/// Why `bytes` cannot be a policy component, judged by their first bytes; `None` when they
/// begin as a component does (the compiler judges the rest).
pub fn not_a_component(bytes: &[u8]) -> Option<String> {
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Some(format!(
            "not WebAssembly: {}; a policy is a WebAssembly component (.wasm)",
            looks_like(bytes)
        ));
    }
    let version = [bytes[4], bytes[5], bytes[6], bytes[7]];
    match version {
        COMPONENT => None,
        CORE_MODULE => Some(
            "a core WebAssembly module, not a component: build one with `cargo build --release \
             --target wasm32-wasip2` (or wrap a module with `wasm-tools component new`)"
                .into(),
        ),
        [a, b, c, d] => Some(format!(
            "WebAssembly of a version this host does not know ({a:#04x} {b:#04x} {c:#04x} \
             {d:#04x}); a policy is a component (0x0d 0x00 0x01 0x00)"
        )),
    }
}

/// What a file that is not WebAssembly seems to be.
fn looks_like(bytes: &[u8]) -> String {
    let starts = |prefix: &[u8]| bytes.starts_with(prefix);
    if bytes.is_empty() {
        "the file is empty".into()
    } else if starts(b"\x7fELF") {
        "an ELF executable or library".into()
    } else if starts(b"PK\x03\x04") {
        "a zip archive".into()
    } else if starts(&[0x1f, 0x8b]) {
        "a gzip file".into()
    } else if starts(b"(module") || starts(b"(component") {
        "WebAssembly text (.wat): compile it to binary first".into()
    } else if let Ok(text) = std::str::from_utf8(&bytes[..bytes.len().min(256)]) {
        let first = text.lines().next().unwrap_or("").trim();
        let quoted: String = first.chars().take(40).collect();
        format!("text beginning `{quoted}`")
    } else {
        format!("{} bytes of something else", bytes.len())
    }
}

/// A compiler's message, on one line and bounded.
pub fn one_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or("").trim();
    if line.len() <= MAX_DETAIL_BYTES {
        return line.to_owned();
    }
    let mut end = MAX_DETAIL_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// The refusal of a component that does not export `asked`'s world, naming the kinds whose
/// interfaces it does export (`exports`: its export names).
pub fn wrong_world<'a>(asked: Kind, exports: impl Iterator<Item = &'a str>) -> String {
    let mut kinds: Vec<Kind> = exports
        .filter_map(|name| {
            let interface = name.strip_prefix("sluice:policy/")?;
            let interface = interface.split('@').next().unwrap_or(interface);
            Kind::ALL.into_iter().find(|k| k.as_str() == interface)
        })
        .collect();
    kinds.dedup();
    match kinds.as_slice() {
        [] => format!(
            "a component that exports no policy interface (a {asked} policy exports \
             `sluice:policy/{asked}`)"
        ),
        [other] => format!("a {other} policy, not a {asked} one: upload it as {other}"),
        others => {
            let names: Vec<&str> = others.iter().map(|k| k.as_str()).collect();
            format!(
                "a component exporting {} but not the {asked} world",
                names.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_wrong_file_is_named_in_one_line() {
        let cases: [(&[u8], &str); 7] = [
            (b"", "the file is empty"),
            (b"\x7fELF\x02\x01\x01\0\0\0", "ELF"),
            (b"PK\x03\x04rest", "zip"),
            (b"fn main() {}\n", "text beginning `fn main() {}`"),
            (b"(module (func))", ".wat"),
            (
                &[0xde, 0xad, 0xbe, 0xef, 0x80, 0x81, 0x82, 0x83, 0x84],
                "9 bytes",
            ),
            (b"\0asm\x01\0\0\0", "core WebAssembly module"),
        ];
        for (bytes, expected) in cases {
            let refusal = not_a_component(bytes).unwrap();
            assert!(refusal.contains(expected), "{refusal}");
            assert_eq!(refusal.lines().count(), 1, "{refusal}");
        }
        assert!(not_a_component(b"\0asm\x0d\0\x01\0").is_none());
        assert!(
            not_a_component(b"\0asm\x02\0\0\0")
                .unwrap()
                .contains("version")
        );
    }

    #[test]
    fn a_component_of_another_kind_is_named() {
        let refusal = wrong_world(Kind::Retry, ["sluice:policy/priority@0.1.0"].into_iter());
        assert_eq!(
            refusal,
            "a priority policy, not a retry one: upload it as priority"
        );
        let refusal = wrong_world(Kind::Retry, ["wasi:cli/run@0.2.0"].into_iter());
        assert!(refusal.contains("exports no policy interface"), "{refusal}");
    }

    #[test]
    fn a_long_message_is_cut_to_one_bounded_line() {
        let long = format!("{}\nsecond line", "x".repeat(1_000));
        let line = one_line(&long);
        assert!(line.len() <= MAX_DETAIL_BYTES + '…'.len_utf8());
        assert!(!line.contains('\n'));
    }
}
