//! A rewrite of a policy component, applied to the defaults at build time: each function the
//! guest's core module exports is lifted from a small shim instance that imports it and exports
//! it again, rather than from the guest's instance itself. The code that runs is the same.
//!
//! Why: wasmtime 48 looks up the function reference of a lifted core function on every call.
//! For a function the instance defines, that rebuilds the reference (a search of the store's
//! code registry and two binary searches of the module's function table: half of a single
//! decision); for one it imports, it is a pointer read. Measured on two test components with
//! the same function among 80 others: 284–297 ns a call lifted directly, 117–163 ns through a
//! shim.
//!
//! Only the shape `wasm32-wasip2` builds of `no_std` guests have is rewritten: one core module
//! without imports, instantiated once, its functions aliased by name. Anything else is refused
//! with the reason, and the caller keeps the component as it was.

use std::collections::HashSet;

const CORE_MODULE_SECTION: u8 = 1;
const CORE_INSTANCE_SECTION: u8 = 2;
const ALIAS_SECTION: u8 = 6;
const HEADER_BYTES: usize = 8;

/// The component with every function export of its core module lifted through a shim.
pub fn lift_through_shim(component: &[u8]) -> Result<Vec<u8>, String> {
    let sections = sections(component)?;
    let modules: Vec<&Section> = sections
        .iter()
        .filter(|s| s.id == CORE_MODULE_SECTION)
        .collect();
    let [module] = modules[..] else {
        return Err(format!("{} core modules, not one", modules.len()));
    };
    let instance_sections: Vec<usize> = (0..sections.len())
        .filter(|&i| sections[i].id == CORE_INSTANCE_SECTION)
        .collect();
    let [instances_at] = instance_sections[..] else {
        return Err("core instances in more than one section".into());
    };
    // One instance: `instantiate` of module 0 with no arguments.
    if sections[instances_at].body != [0x01, 0x00, 0x00, 0x00] {
        return Err("the core instance is not module 0 instantiated alone".into());
    }
    let exports = function_exports(module.body)?;
    if exports.is_empty() {
        return Err("the core module exports no function".into());
    }
    let names: HashSet<&str> = exports.iter().map(|(name, _)| name.as_str()).collect();

    let mut out = component[..HEADER_BYTES].to_vec();
    for (index, section) in sections.iter().enumerate() {
        if section.id == ALIAS_SECTION {
            write_section(
                &mut out,
                ALIAS_SECTION,
                &repoint_aliases(section.body, &names)?,
            );
        } else {
            write_section(&mut out, section.id, section.body);
        }
        if index == instances_at {
            write_section(&mut out, CORE_MODULE_SECTION, &shim_module(&exports)?);
            // Instance 1: module 1 instantiated with "m" = instance 0.
            write_section(
                &mut out,
                CORE_INSTANCE_SECTION,
                &[0x01, 0x00, 0x01, 0x01, 0x01, b'm', 0x12, 0x00],
            );
        }
    }
    Ok(out)
}

struct Section<'a> {
    id: u8,
    body: &'a [u8],
}

/// The top-level sections; nested components are kept whole (the guests' nested component
/// only types the exported interface and holds no core definitions).
fn sections(component: &[u8]) -> Result<Vec<Section<'_>>, String> {
    if component.len() < HEADER_BYTES || &component[..4] != b"\0asm" {
        return Err("not a WebAssembly binary".into());
    }
    let mut at = HEADER_BYTES;
    let mut sections = Vec::new();
    while at < component.len() {
        let id = component[at];
        at += 1;
        let size = leb_u32(component, &mut at)? as usize;
        let body = component
            .get(at..at + size)
            .ok_or("a section runs past the end")?;
        sections.push(Section { id, body });
        at += size;
    }
    Ok(sections)
}

/// Each exported function's name and type, in export order; refused when the module imports
/// anything (imported functions would shift the index space this does not track).
fn function_exports(module: &[u8]) -> Result<Vec<(String, wasmparser::FuncType)>, String> {
    use wasmparser::{ExternalKind, Parser, Payload};
    let mut types = Vec::new();
    let mut functions = Vec::new();
    let mut exports = Vec::new();
    for payload in Parser::new(0).parse_all(module) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(_) => return Err("the core module has imports".into()),
            Payload::TypeSection(reader) => {
                for ty in reader.into_iter_err_on_gc_types() {
                    types.push(ty.map_err(|e| e.to_string())?);
                }
            }
            Payload::FunctionSection(reader) => {
                for ty in reader {
                    functions.push(ty.map_err(|e| e.to_string())?);
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(|e| e.to_string())?;
                    if export.kind == ExternalKind::Func {
                        exports.push((export.name.to_string(), export.index));
                    }
                }
            }
            _ => {}
        }
    }
    exports
        .into_iter()
        .map(|(name, index)| {
            let ty = functions
                .get(index as usize)
                .and_then(|&ty| types.get(ty as usize))
                .ok_or_else(|| format!("export {name} names no function"))?;
            Ok((name, ty.clone()))
        })
        .collect()
}

/// A core module that imports each function from "m" and exports it under the same name.
fn shim_module(exports: &[(String, wasmparser::FuncType)]) -> Result<Vec<u8>, String> {
    let mut types = Vec::new();
    let mut imports = Vec::new();
    let mut reexports = Vec::new();
    write_u32(&mut types, exports.len());
    write_u32(&mut imports, exports.len());
    write_u32(&mut reexports, exports.len());
    for (index, (name, ty)) in exports.iter().enumerate() {
        types.push(0x60);
        for list in [ty.params(), ty.results()] {
            write_u32(&mut types, list.len());
            for value in list {
                types.push(value_type(*value)?);
            }
        }
        write_name(&mut imports, "m");
        write_name(&mut imports, name);
        imports.push(0x00);
        write_u32(&mut imports, index);
        write_name(&mut reexports, name);
        reexports.push(0x00);
        write_u32(&mut reexports, index);
    }
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    write_section(&mut module, 1, &types);
    write_section(&mut module, 2, &imports);
    write_section(&mut module, 7, &reexports);
    Ok(module)
}

fn value_type(value: wasmparser::ValType) -> Result<u8, String> {
    use wasmparser::ValType;
    match value {
        ValType::I32 => Ok(0x7f),
        ValType::I64 => Ok(0x7e),
        ValType::F32 => Ok(0x7d),
        ValType::F64 => Ok(0x7c),
        other => Err(format!("a {other:?} in an exported signature")),
    }
}

/// One entry of an alias section: its bytes, and the instance and name when it aliases a core
/// function exported by a core instance.
struct Alias<'a> {
    bytes: &'a [u8],
    core_function: Option<(u32, &'a str)>,
}

/// The entries of an alias section, in order.
fn aliases(body: &[u8]) -> Result<Vec<Alias<'_>>, String> {
    let mut at = 0;
    let count = leb_u32(body, &mut at)?;
    let mut entries = Vec::new();
    for _ in 0..count {
        let start = at;
        let sort = *body.get(at).ok_or("a short alias")?;
        at += 1;
        let core_sort = if sort == 0x00 {
            let core = *body.get(at).ok_or("a short alias")?;
            at += 1;
            Some(core)
        } else {
            None
        };
        let target = *body.get(at).ok_or("a short alias")?;
        at += 1;
        let mut core_function = None;
        match target {
            // The export of a (core) instance: instance index, name.
            0x00 | 0x01 => {
                let instance = leb_u32(body, &mut at)?;
                let name = read_name(body, &mut at)?;
                if target == 0x01 && core_sort == Some(0x00) {
                    core_function = Some((instance, name));
                }
            }
            // Outer: count, index.
            0x02 => {
                leb_u32(body, &mut at)?;
                leb_u32(body, &mut at)?;
            }
            other => return Err(format!("alias target {other:#x}")),
        }
        entries.push(Alias {
            bytes: &body[start..at],
            core_function,
        });
    }
    if at != body.len() {
        return Err("bytes after the last alias".into());
    }
    Ok(entries)
}

/// The alias section with each alias of a core function of instance 0 named in `names`
/// pointed at the same name in instance 1 (the shim); every other alias byte for byte.
fn repoint_aliases(body: &[u8], names: &HashSet<&str>) -> Result<Vec<u8>, String> {
    let entries = aliases(body)?;
    let mut out = Vec::with_capacity(body.len());
    write_u32(&mut out, entries.len());
    for alias in entries {
        match alias.core_function {
            Some((0, name)) if names.contains(name) => {
                // Core sort "func" and target "core export": the same three bytes.
                out.extend_from_slice(&alias.bytes[..3]);
                write_u32(&mut out, 1);
                write_name(&mut out, name);
            }
            _ => out.extend_from_slice(alias.bytes),
        }
    }
    Ok(out)
}

fn leb_u32(bytes: &[u8], at: &mut usize) -> Result<u32, String> {
    let mut value: u64 = 0;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(*at).ok_or("a number runs past the end")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return u32::try_from(value).map_err(|_| "a number past u32".to_string());
        }
    }
    Err("a number longer than 5 bytes".into())
}

fn read_name<'a>(bytes: &'a [u8], at: &mut usize) -> Result<&'a str, String> {
    let length = leb_u32(bytes, at)? as usize;
    let name = bytes
        .get(*at..*at + length)
        .ok_or("a name runs past the end")?;
    *at += length;
    std::str::from_utf8(name).map_err(|_| "a name that is not UTF-8".to_string())
}

fn write_u32(out: &mut Vec<u8>, value: usize) {
    let mut value = value as u64;
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn write_name(out: &mut Vec<u8>, name: &str) {
    write_u32(out, name.len());
    out.extend_from_slice(name.as_bytes());
}

fn write_section(out: &mut Vec<u8>, id: u8, body: &[u8]) {
    out.push(id);
    write_u32(out, body.len());
    out.extend_from_slice(body);
}

// Compiled with the runtime's tests (see `lib.rs`), where the embedded defaults exist.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;

    /// Names of the core functions aliased from `instance` in the component's alias sections.
    fn function_aliases_of(component: &[u8], instance: u32) -> Vec<String> {
        sections(component)
            .unwrap()
            .iter()
            .filter(|section| section.id == ALIAS_SECTION)
            .flat_map(|section| aliases(section.body).unwrap())
            .filter_map(|alias| alias.core_function)
            .filter(|(from, _)| *from == instance)
            .map(|(_, name)| name.to_string())
            .collect()
    }

    #[test]
    fn every_embedded_policy_decides_through_its_shim() {
        // split-ivf imports its version's data and is embedded as built (see build.rs).
        for (name, component) in defaults::BY_NAME.iter().filter(|(n, _)| *n != "split-ivf") {
            let modules = sections(component)
                .unwrap()
                .iter()
                .filter(|s| s.id == CORE_MODULE_SECTION)
                .count();
            assert_eq!(modules, 2, "{name}: the guest and its shim");
            assert!(
                function_aliases_of(component, 0).is_empty(),
                "{name}: a function still lifted from the guest's own instance"
            );
            assert!(
                function_aliases_of(component, 1)
                    .iter()
                    .any(|f| f.contains("#init")),
                "{name}: init comes through the shim"
            );
            // Rewriting twice is refused rather than stacking shims.
            assert!(lift_through_shim(component).is_err());
        }
    }

    #[test]
    fn only_function_aliases_of_the_guest_named_in_its_exports_move() {
        let mut section = vec![0x04];
        // core func "f" of instance 0: moves to instance 1.
        section.extend([0x00, 0x00, 0x01, 0x00, 0x01, b'f']);
        // core memory "f" of instance 0: stays.
        section.extend([0x00, 0x02, 0x01, 0x00, 0x01, b'f']);
        // core func "g" of instance 0, which the module does not export: stays.
        section.extend([0x00, 0x00, 0x01, 0x00, 0x01, b'g']);
        // an outer alias of a type: stays.
        section.extend([0x03, 0x02, 0x01, 0x05]);
        let names = HashSet::from(["f"]);
        let out = repoint_aliases(&section, &names).unwrap();
        let mut want = section.clone();
        want[4] = 0x01;
        assert_eq!(out, want);
        assert!(repoint_aliases(&section[..section.len() - 1], &names).is_err());
    }

    #[test]
    fn what_is_not_a_single_module_guest_is_refused() {
        assert!(lift_through_shim(b"garbage").is_err());
        assert!(
            lift_through_shim(b"\0asm\x0d\0\x01\0").is_err(),
            "no core module"
        );
        assert!(
            lift_through_shim(b"\0asm\x0d\0\x01\0\x01\x05").is_err(),
            "cut short"
        );
    }
}
