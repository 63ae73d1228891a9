//! The README, `docs/` and the Python client's README: every relative link resolves to a file of the repository, and every
//! `#anchor` to a heading of the page it names. The README stays under 20 KB.

use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace above tests/")
        .to_path_buf()
}

/// The pages checked: the README, every Markdown file under `docs/`, and the Python client's.
fn pages() -> Vec<PathBuf> {
    let root = repository();
    let mut pages = vec![
        root.join("README.md"),
        root.join("clients/python/README.md"),
    ];
    let docs = std::fs::read_dir(root.join("docs")).expect("a docs/ folder");
    for entry in docs {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// The targets of the `[text](target)` links in `markdown`, outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(slug(line.trim_start_matches('#')));
        }
    }
    found
}

#[test]
fn every_link_in_the_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a folder").join(file)
            };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).iter().any(|a| a == anchor) {
                    broken.push(format!("{}: {link} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked >= 10,
        "only {checked} links found: is the parser blind?"
    );
}

#[test]
fn the_readme_stays_under_20_kb() {
    let size = std::fs::metadata(repository().join("README.md"))
        .expect("README.md")
        .len();
    assert!(size < 20 * 1024, "README.md is {size} bytes");
}

#[test]
fn the_link_checker_sees_a_broken_link_and_anchor() {
    let page =
        "see [a](missing.md) and [b](#nowhere)\n```\n[c](ignored.md)\n```\n## A heading, here";
    assert_eq!(links(page), ["missing.md", "#nowhere"]);
    assert_eq!(anchors(page), ["a-heading-here"]);
}
