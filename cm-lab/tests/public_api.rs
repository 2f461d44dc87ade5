//! The public API of the library crates a sibling service depends on (`cm-domain`, `cm-store`,
//! `cm-dispatch`), recorded in `docs/api/CRATE.txt` and compared with the sources here: a change
//! to a public item's signature (a function's parameters, a struct's public fields, an enum's
//! variants, a trait's methods, a re-export) fails this test until the record is rewritten
//! with `CM_BLESS_API=1 cargo test -p cm-lab --test public_api`, so the change shows in the
//! diff of the commit that makes it.
//!
//! The record is read from the sources with `syn`, module by module from `lib.rs`: every item
//! declared `pub` (not `pub(crate)`), in a `pub mod` or not (a private module's `pub` item may
//! be re-exported), and the `pub` methods of inherent impls and the trait impls of public
//! types. Test modules (`#[cfg(test)]`, `#[cfg(doctest)]`) are left out. One line per item,
//! prefixed by its module path and sorted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::{Attribute, ImplItem, Item, TraitItem, Visibility};

const CRATES: [&str; 3] = ["cm-domain", "cm-store", "cm-dispatch"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Tokens as one line with the spaces `to_string` leaves around punctuation closed up.
fn text(tokens: &impl ToTokens) -> String {
    let mut s = tokens.to_token_stream().to_string();
    for (from, to) in [
        (" :: ", "::"),
        (":: ", "::"),
        (" ,", ","),
        ("& ", "&"),
        (" <", "<"),
        ("< ", "<"),
        (" >", ">"),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
        (" ;", ";"),
        ("# [", "#["),
        (" ?", "?"),
        ("' ", "'"),
    ] {
        while s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

fn public(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let cfg = text(&a.meta);
            cfg.contains("test") || cfg.contains("doctest")
        }
    })
}

/// The `#[cfg(feature = …)]` of an item, written before it, so a feature-gated item says so.
fn features(attrs: &[Attribute]) -> String {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg") && text(&a.meta).contains("feature"))
        .map(|a| format!("{} ", text(&a.meta)))
        .collect()
}

fn record(items: &[Item], path: &str, dir: &Path, file_stem: &str, out: &mut BTreeSet<String>) {
    for item in items {
        let line = |what: String| format!("{path}: {what}");
        match item {
            Item::Mod(m) if !is_test_only(&m.attrs) => {
                let name = m.ident.to_string();
                let child = format!("{path}::{name}");
                if public(&m.vis) {
                    out.insert(line(format!("{}mod {name}", features(&m.attrs))));
                }
                // A module's file: beside lib.rs/mod.rs, or in a directory named after this
                // file's own module.
                let base = if file_stem == "lib" || file_stem == "mod" {
                    dir.to_path_buf()
                } else {
                    dir.join(file_stem)
                };
                match &m.content {
                    Some((_, inner)) => record(inner, &child, &base, &name, out),
                    None => {
                        let (file, next_dir) = if base.join(format!("{name}.rs")).exists() {
                            (base.join(format!("{name}.rs")), base.clone())
                        } else {
                            (base.join(&name).join("mod.rs"), base.join(&name))
                        };
                        let source = std::fs::read_to_string(&file)
                            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
                        let parsed = syn::parse_file(&source)
                            .unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
                        let stem = if file.ends_with("mod.rs") {
                            "mod"
                        } else {
                            name.as_str()
                        };
                        record(&parsed.items, &child, &next_dir, stem, out);
                    }
                }
            }
            Item::Fn(f) if public(&f.vis) && !is_test_only(&f.attrs) => {
                out.insert(line(format!("{}{}", features(&f.attrs), text(&f.sig))));
            }
            Item::Struct(s) if public(&s.vis) && !is_test_only(&s.attrs) => {
                let fields: Vec<String> = s
                    .fields
                    .iter()
                    .filter(|f| public(&f.vis))
                    .map(|f| match &f.ident {
                        Some(name) => format!("{name}: {}", text(&f.ty)),
                        None => text(&f.ty),
                    })
                    .collect();
                let hidden = s.fields.iter().filter(|f| !public(&f.vis)).count();
                let non_exhaustive = s.attrs.iter().any(|a| a.path().is_ident("non_exhaustive"));
                out.insert(line(format!(
                    "{}{}struct {}{} {{ {}{} }}",
                    features(&s.attrs),
                    if non_exhaustive {
                        "#[non_exhaustive] "
                    } else {
                        ""
                    },
                    s.ident,
                    text(&s.generics),
                    fields.join(", "),
                    if hidden > 0 { ", .." } else { "" }
                )));
            }
            Item::Enum(e) if public(&e.vis) && !is_test_only(&e.attrs) => {
                let variants: Vec<String> = e
                    .variants
                    .iter()
                    .map(|v| format!("{}{}", v.ident, text(&v.fields)))
                    .collect();
                let non_exhaustive = e.attrs.iter().any(|a| a.path().is_ident("non_exhaustive"));
                out.insert(line(format!(
                    "{}{}enum {}{} {{ {} }}",
                    features(&e.attrs),
                    if non_exhaustive {
                        "#[non_exhaustive] "
                    } else {
                        ""
                    },
                    e.ident,
                    text(&e.generics),
                    variants.join(", ")
                )));
            }
            Item::Trait(t) if public(&t.vis) && !is_test_only(&t.attrs) => {
                let methods: Vec<String> = t
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        TraitItem::Fn(f) => Some(text(&f.sig)),
                        TraitItem::Const(c) => Some(format!("const {}: {}", c.ident, text(&c.ty))),
                        TraitItem::Type(ty) => Some(format!("type {}", ty.ident)),
                        _ => None,
                    })
                    .collect();
                out.insert(line(format!(
                    "{}trait {}{}{} {{ {} }}",
                    features(&t.attrs),
                    t.ident,
                    text(&t.generics),
                    if t.supertraits.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", text(&t.supertraits))
                    },
                    methods.join("; ")
                )));
            }
            Item::Const(c) if public(&c.vis) && !is_test_only(&c.attrs) => {
                out.insert(line(format!("const {}: {}", c.ident, text(&c.ty))));
            }
            Item::Static(s) if public(&s.vis) && !is_test_only(&s.attrs) => {
                out.insert(line(format!("static {}: {}", s.ident, text(&s.ty))));
            }
            Item::Type(t) if public(&t.vis) && !is_test_only(&t.attrs) => {
                out.insert(line(format!("type {} = {}", t.ident, text(&t.ty))));
            }
            Item::Use(u) if public(&u.vis) && !is_test_only(&u.attrs) => {
                out.insert(line(format!("{}use {}", features(&u.attrs), text(&u.tree))));
            }
            Item::Impl(i) if !is_test_only(&i.attrs) => {
                let target = text(&i.self_ty);
                match &i.trait_ {
                    Some((_, trait_path, _)) => {
                        out.insert(line(format!(
                            "{}impl{} {} for {target}",
                            features(&i.attrs),
                            text(&i.generics),
                            text(trait_path)
                        )));
                    }
                    None => {
                        for member in &i.items {
                            if let ImplItem::Fn(f) = member
                                && public(&f.vis)
                                && !is_test_only(&f.attrs)
                            {
                                out.insert(line(format!(
                                    "{}impl {target} {{ {} }}",
                                    features(&f.attrs),
                                    text(&f.sig)
                                )));
                            }
                            if let ImplItem::Const(c) = member
                                && public(&c.vis)
                            {
                                out.insert(line(format!(
                                    "impl {target} {{ const {}: {} }}",
                                    c.ident,
                                    text(&c.ty)
                                )));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn api_of(krate: &str) -> String {
    let src = root().join(krate).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let parsed = syn::parse_file(&lib).expect("parsing lib.rs");
    let mut out = BTreeSet::new();
    let name = krate.replace('-', "_");
    record(&parsed.items, &name, &src, "lib", &mut out);
    let mut text: String = out.into_iter().map(|l| l + "\n").collect();
    text.insert_str(
        0,
        &format!(
            "# The public API of {krate}, as cm-lab/tests/public_api.rs reads it from the sources.\n\
             # Rewrite with CM_BLESS_API=1 cargo test -p cm-lab --test public_api.\n"
        ),
    );
    text
}

#[test]
fn the_public_api_is_the_recorded_one() {
    let bless = std::env::var_os("CM_BLESS_API").is_some();
    let mut changed = Vec::new();
    for krate in CRATES {
        let now = api_of(krate);
        let file = root().join("docs/api").join(format!("{krate}.txt"));
        let recorded = std::fs::read_to_string(&file).unwrap_or_default();
        if now != recorded {
            if bless {
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(&file, &now).unwrap();
            } else {
                let old: BTreeSet<&str> = recorded.lines().collect();
                let new: BTreeSet<&str> = now.lines().collect();
                let gone: Vec<&&str> = old.difference(&new).collect();
                let added: Vec<&&str> = new.difference(&old).collect();
                changed.push(format!(
                    "{krate}: {} gone, {} new\n  - {}\n  + {}",
                    gone.len(),
                    added.len(),
                    gone.iter()
                        .map(|l| l.to_string())
                        .collect::<Vec<_>>()
                        .join("\n  - "),
                    added
                        .iter()
                        .map(|l| l.to_string())
                        .collect::<Vec<_>>()
                        .join("\n  + ")
                ));
            }
        }
    }
    assert!(
        changed.is_empty(),
        "the public API changed; if that is meant, rewrite docs/api with \
         CM_BLESS_API=1 cargo test -p cm-lab --test public_api and commit it:\n{}",
        changed.join("\n")
    );
}
