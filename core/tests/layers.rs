//! core's top-level modules form layers. The map is the table under
//! "Layers" in src/lib.rs's crate docs; these tests keep it true: every
//! module is in one row, a module uses only modules of its row or of rows
//! below it, and no modules use each other, however indirectly.
//!
//! The test reads src/ as text, with std only. It follows the `mod`
//! declarations from lib.rs (so a `#[path]` or a `#[cfg(feature)]` module is
//! seen, and a file no `mod` names is not), leaves out every item under
//! `#[cfg(test)]`, `#[cfg(doctest)]` or `#[cfg(all(test, …))]`, and
//! collects each path that leaves its top-level module: `crate::x::…`, each
//! member of `use crate::{x, y::…}`, and a `super::` that climbs out of it.
//! Comments (doc links included) and strings make no edge.
//!
//! A name re-exported at the crate root (`crate::Error`) counts as an edge to
//! the module it is re-exported from (`error`): lib.rs is the root, not a
//! module, and its `pub use`s are the public paths, so a re-export there
//! neither hides a dependency nor makes one. A `pub use` kept inside a module
//! for an old path (`runner::Drained`, the `delay` constants) is an edge of
//! that module like any other, and points down.
//!
//! What a text reader cannot see: a method called on a type whose `impl`
//! block lives in a higher module (`impl Connection` in `request.rs` and
//! `consumer/handle.rs`). Those are used only from their own layer or above;
//! the compiler does not check that, and neither does this.
//!
//! Run: `cargo test -p acemq --test layers -- --nocapture` prints the count
//! of modules and edges and, for each module, the modules it uses; with
//! `LAYERS_SRC=<dir>` it reads that tree instead (another commit's src/).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
struct Tok {
    s: String,
    line: usize,
    string: bool,
}

/// Words, `::`, single punctuation and string literals; comments, char
/// literals and lifetimes dropped, so no comment or string makes an edge.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    // Skips a string body from just after its opening quote; raw strings end
    // at `"` followed by `hashes` hash marks and have no escapes.
    let string = |i: &mut usize, line: &mut usize, hashes: Option<usize>| -> String {
        let mut s = String::new();
        while *i < c.len() {
            let ch = c[*i];
            if ch == '\n' {
                *line += 1;
            }
            match hashes {
                None if ch == '\\' => {
                    *i += 2;
                    continue;
                }
                None if ch == '"' => {
                    *i += 1;
                    return s;
                }
                Some(n) if ch == '"' && (0..n).all(|k| c.get(*i + 1 + k) == Some(&'#')) => {
                    *i += 1 + n;
                    return s;
                }
                _ => {}
            }
            s.push(ch);
            *i += 1;
        }
        s
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            let at = line;
            i += 1;
            let s = string(&mut i, &mut line, None);
            out.push(Tok { s, line: at, string: true });
        } else if ch == '\'' {
            // 'a' or '\n' is a char literal; 'a without a closing quote is a
            // lifetime or a label.
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && ident(c[i]) {
                    i += 1;
                }
            }
        } else if ident(ch) {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw = matches!(word.as_str(), "r" | "br" | "cr");
            if raw && matches!(c.get(i), Some('"') | Some('#')) {
                let mut hashes = 0;
                while c.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if c.get(i) == Some(&'"') {
                    let at = line;
                    i += 1;
                    let s = string(&mut i, &mut line, Some(hashes));
                    out.push(Tok { s, line: at, string: true });
                    continue;
                }
                // r#ident: a raw identifier.
                let start = i;
                while i < c.len() && ident(c[i]) {
                    i += 1;
                }
                let s = c[start..i].iter().collect();
                out.push(Tok { s, line, string: false });
            } else if matches!(word.as_str(), "b" | "c") && c.get(i) == Some(&'"') {
                let at = line;
                i += 1;
                let s = string(&mut i, &mut line, None);
                out.push(Tok { s, line: at, string: true });
            } else if word == "b" && c.get(i) == Some(&'\'') {
                i += 1;
                if c.get(i) == Some(&'\\') {
                    i += 1;
                }
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else {
                out.push(Tok { s: word, line, string: false });
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok { s: "::".into(), line, string: false });
            i += 2;
        } else {
            out.push(Tok { s: ch.to_string(), line, string: false });
            i += 1;
        }
    }
    out
}

fn is(t: Option<&Tok>, s: &str) -> bool {
    t.is_some_and(|t| !t.string && t.s == s)
}

/// The index just past the bracket that closes the one at `open`.
fn close(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0i32;
    let mut i = open;
    while i < toks.len() {
        if !toks[i].string {
            match toks[i].s.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    toks.len()
}

/// The index just past the item that starts at `i`: a `use` ends at its `;`,
/// anything else at a `;` or at the `}` of its first block.
fn item_end(toks: &[Tok], mut i: usize) -> usize {
    let is_use = toks[i..].iter().take(6).any(|t| !t.string && t.s == "use");
    while i < toks.len() {
        let t = &toks[i];
        if !t.string && t.s == ";" {
            return i + 1;
        }
        if !t.string && matches!(t.s.as_str(), "(" | "[" | "{") {
            let end = close(toks, i);
            if t.s == "{" && !is_use {
                return end;
            }
            i = end;
            continue;
        }
        i += 1;
    }
    toks.len()
}

/// `cfg(test)` or `cfg(all(…, test, …))`: compiled only for tests (unit or
/// doc tests).
fn test_only(attr: &[Tok]) -> bool {
    let words: Vec<&str> = attr.iter().filter(|t| !t.string).map(|t| t.s.as_str()).collect();
    match words.as_slice() {
        ["cfg", "(", "test" | "doctest", ")"] => true,
        ["cfg", "(", "all", "(", rest @ ..] => {
            let mut depth = 1;
            for (k, w) in rest.iter().enumerate() {
                match *w {
                    "(" => depth += 1,
                    ")" => depth -= 1,
                    "test" | "doctest" if depth == 1 && matches!(rest.get(k + 1), Some(&",") | Some(&")")) => return true,
                    _ => {}
                }
            }
            false
        }
        _ => false,
    }
}

/// Where a reference was seen, to say why an edge exists.
#[derive(Debug, Clone)]
struct Site {
    file: String,
    line: usize,
    path: String,
}

struct Crate {
    src: PathBuf,
    /// Top-level module -> the first segments of the paths it names outside
    /// itself (a module name or a name the root re-exports).
    uses: BTreeMap<String, Vec<(String, Site)>>,
    /// Name the root brings in with `use` -> the module it comes from.
    root: BTreeMap<String, String>,
    modules: BTreeSet<String>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut krate = Crate { src: src.to_path_buf(), uses: BTreeMap::new(), root: BTreeMap::new(), modules: BTreeSet::new() };
        krate.file(&src.join("lib.rs"), &[], src);
        krate
    }

    /// Reads one file of module `module` (empty for lib.rs); `dir` is where
    /// its children's files live.
    fn file(&mut self, path: &Path, module: &[String], dir: &Path) {
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let toks = lex(&text);
        let name = path.strip_prefix(&self.src).unwrap().display().to_string();
        let file_dir = path.parent().unwrap().to_path_buf();
        // Inline `mod x { … }` blocks open here: (name, the index of their `}`).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut attr_test = false;
        let mut attr_path: Option<String> = None;
        let mut i = 0;
        while i < toks.len() {
            while inline.last().is_some_and(|(_, end)| i >= *end) {
                inline.pop();
            }
            let t = &toks[i];
            if t.string {
                i += 1;
                continue;
            }
            if t.s == "#" {
                let inner = is(toks.get(i + 1), "!");
                let open = if inner { i + 2 } else { i + 1 };
                if !is(toks.get(open), "[") {
                    i += 1;
                    continue;
                }
                let end = close(&toks, open);
                let attr = &toks[open + 1..end - 1];
                if test_only(attr) {
                    if inner {
                        return;
                    }
                    attr_test = true;
                }
                if is(attr.first(), "path") && attr.len() == 3 && attr[2].string {
                    attr_path = Some(attr[2].s.clone());
                }
                i = end;
                continue;
            }
            if attr_test {
                attr_test = false;
                attr_path = None;
                i = item_end(&toks, i);
                continue;
            }
            let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
            if t.s == "mod" && toks.get(i + 1).is_some_and(|n| !n.string) {
                let child = toks[i + 1].s.clone();
                if is(toks.get(i + 2), ";") {
                    let base = if inline.is_empty() { dir.to_path_buf() } else { inline.iter().fold(dir.to_path_buf(), |d, (n, _)| d.join(n)) };
                    let (file, child_dir) = match attr_path.take() {
                        Some(p) => {
                            let f = if inline.is_empty() { file_dir.join(p) } else { base.join(p) };
                            let d = f.parent().unwrap().join(&child);
                            (f, d)
                        }
                        None if base.join(format!("{child}.rs")).exists() => (base.join(format!("{child}.rs")), base.join(&child)),
                        None => (base.join(&child).join("mod.rs"), base.join(&child)),
                    };
                    let mut path = here.clone();
                    path.push(child.clone());
                    if module.is_empty() && inline.is_empty() {
                        self.modules.insert(child.clone());
                    }
                    self.file(&file, &path, &child_dir);
                    i += 3;
                    continue;
                }
                if is(toks.get(i + 2), "{") {
                    if module.is_empty() && inline.is_empty() {
                        self.modules.insert(child.clone());
                    }
                    inline.push((child, close(&toks, i + 2) - 1));
                    i += 3;
                    continue;
                }
            }
            attr_path = None;
            if here.is_empty() {
                if t.s == "use" {
                    let end = item_end(&toks, i);
                    let mut leaves = Vec::new();
                    use_tree(&toks[i + 1..end - 1], &mut Vec::new(), &mut leaves);
                    for (leaf, from) in leaves {
                        self.root.insert(leaf, from);
                    }
                    i = end;
                    continue;
                }
                i += 1;
                continue;
            }
            // A path that leaves the module: crate::…, or enough super::.
            let starts_path = !is(toks.get(i.wrapping_sub(1)), "::") && is(toks.get(i + 1), "::");
            let absolute = if starts_path && t.s == "crate" {
                Some((Vec::new(), i + 2))
            } else if starts_path && t.s == "super" {
                let mut at = i;
                let mut base = here.clone();
                while is(toks.get(at), "super") && is(toks.get(at + 1), "::") {
                    base.pop();
                    at += 2;
                }
                Some((base, at))
            } else {
                None
            };
            let Some((base, at)) = absolute else {
                i += 1;
                continue;
            };
            let mut firsts = Vec::new();
            if let Some(top) = base.first() {
                firsts.push((top.clone(), at));
            } else if is(toks.get(at), "{") {
                let end = close(&toks, at);
                let mut k = at + 1;
                let mut depth = 0;
                let mut expect = true;
                while k < end - 1 {
                    let s = toks[k].s.as_str();
                    match s {
                        "{" | "(" | "[" => depth += 1,
                        "}" | ")" | "]" => depth -= 1,
                        "," if depth == 0 => expect = true,
                        _ if expect && depth == 0 => {
                            if s != "self" && s != "*" {
                                firsts.push((s.to_string(), k));
                            }
                            expect = false;
                        }
                        _ => {}
                    }
                    k += 1;
                }
            } else if let Some(n) = toks.get(at) {
                firsts.push((n.s.clone(), at));
            }
            for (first, k) in firsts {
                if first == here[0] {
                    continue;
                }
                let path: String = toks[k..].iter().take_while(|t| !t.string && (t.s == "::" || t.s.chars().all(|c| c.is_alphanumeric() || c == '_'))).map(|t| t.s.as_str()).collect();
                let site = Site { file: name.clone(), line: toks[k].line, path };
                self.uses.entry(here[0].clone()).or_default().push((first, site));
            }
            i = at;
        }
    }

    /// The graph: module -> module it uses -> the places that say so. With
    /// `resolve_root`, a name the root re-exports counts as its module.
    fn graph(&self, resolve_root: bool) -> (BTreeMap<String, BTreeMap<String, Vec<Site>>>, Vec<Site>) {
        let mut graph: BTreeMap<String, BTreeMap<String, Vec<Site>>> = self.modules.iter().map(|m| (m.clone(), BTreeMap::new())).collect();
        let mut unresolved = Vec::new();
        for (from, uses) in &self.uses {
            for (first, site) in uses {
                let to = if self.modules.contains(first) {
                    first.clone()
                } else if let Some(m) = self.root.get(first) {
                    if !resolve_root {
                        continue;
                    }
                    m.clone()
                } else {
                    unresolved.push(site.clone());
                    continue;
                };
                if &to != from {
                    graph.get_mut(from).unwrap().entry(to).or_default().push(site.clone());
                }
            }
        }
        (graph, unresolved)
    }
}

/// The leaves of a `use` tree (`a::{b::C, D as E}` gives C and E), each with
/// the first segment of its path.
fn use_tree(toks: &[Tok], prefix: &mut Vec<String>, out: &mut Vec<(String, String)>) {
    let mut i = 0;
    let start = prefix.len();
    while i < toks.len() {
        let s = toks[i].s.as_str();
        match s {
            "::" | "pub" => i += 1,
            "(" => i = close(toks, i),
            "{" => {
                let end = close(toks, i);
                let inner = &toks[i + 1..end - 1];
                let mut depth = 0;
                let mut from = 0;
                for (k, t) in inner.iter().enumerate() {
                    match t.s.as_str() {
                        "{" => depth += 1,
                        "}" => depth -= 1,
                        "," if depth == 0 => {
                            use_tree(&inner[from..k], prefix, out);
                            from = k + 1;
                        }
                        _ => {}
                    }
                }
                use_tree(&inner[from..], prefix, out);
                i = end;
            }
            "as" => {
                let leaf = toks[i + 1].s.clone();
                out.push((leaf, prefix.first().cloned().unwrap_or_default()));
                prefix.truncate(start);
                return;
            }
            _ => {
                prefix.push(s.to_string());
                i += 1;
            }
        }
    }
    if prefix.len() > start {
        let leaf = prefix.last().unwrap().clone();
        let leaf = if leaf == "self" { prefix[prefix.len() - 2].clone() } else { leaf };
        out.push((leaf, prefix[0].clone()));
    }
    prefix.truncate(start);
}

/// Strongly connected components of more than one module (Tarjan's).
fn cycles(graph: &BTreeMap<String, BTreeMap<String, Vec<Site>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, Vec<Site>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.graph[v].keys() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let l = s.low[v].min(s.low[w]);
                s.low.insert(v, l);
            } else if s.on.contains(w) {
                let l = s.low[v].min(s.index[w]);
                s.low.insert(v, l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The rows of the table under "# Layers" in lib.rs's docs, top first: each
/// row's name and the modules named in its second column.
fn layer_map(lib: &str) -> Vec<(String, Vec<String>)> {
    let docs: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("//!")).map(str::trim).collect();
    let start = docs.iter().position(|l| *l == "# Layers").expect("lib.rs's docs have a \"# Layers\" section");
    docs[start..]
        .iter()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let modules = cells[2].split(',').map(|m| m.trim().trim_matches('`').to_string()).collect();
            (cells[1].to_string(), modules)
        })
        .collect()
}

fn edges(graph: &BTreeMap<String, BTreeMap<String, Vec<Site>>>) -> usize {
    graph.values().map(BTreeMap::len).sum()
}

fn describe(graph: &BTreeMap<String, BTreeMap<String, Vec<Site>>>, cycles: &[Vec<String>]) -> String {
    let mut out = String::new();
    for scc in cycles {
        out += &format!("cycle of {} modules: {}\n", scc.len(), scc.join(", "));
        for from in scc {
            for (to, sites) in &graph[from] {
                if scc.contains(to) {
                    let s = &sites[0];
                    let more = if sites.len() > 1 { format!(" (+{} more)", sites.len() - 1) } else { String::new() };
                    out += &format!("  {from} -> {to}: {}:{} {}{more}\n", s.file, s.line, s.path);
                }
            }
        }
    }
    out
}

/// Where `graph` disagrees with `map` (rows top first): a module in no row
/// or in two, a name in a row that is no module, a use that points up.
/// Empty: none.
fn against_map(graph: &BTreeMap<String, BTreeMap<String, Vec<Site>>>, map: &[(String, Vec<String>)]) -> String {
    let mut row: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = String::new();
    for (i, (_, modules)) in map.iter().enumerate() {
        for m in modules {
            if row.insert(m, i).is_some() {
                out += &format!("  `{m}` is in two rows\n");
            }
            if !graph.contains_key(m) {
                out += &format!("  `{m}` is not a module of the crate\n");
            }
        }
    }
    for m in graph.keys().filter(|m| !row.contains_key(m.as_str())) {
        out += &format!("  `{m}` is in no row\n");
    }
    for (from, tos) in graph {
        for (to, sites) in tos {
            let (Some(&f), Some(&t)) = (row.get(from.as_str()), row.get(to.as_str())) else { continue };
            // Rows are top first: a use points to the same row or a later one.
            if t < f {
                let s = &sites[0];
                out += &format!("  {from} ({}) uses {to} ({}), a row above it: {}:{} {}\n", map[f].0, map[t].0, s.file, s.line, s.path);
            }
        }
    }
    out
}

#[test]
fn top_level_modules_form_no_cycle() {
    // LAYERS_SRC reads another tree, to measure it (an older commit's src/).
    let src = std::env::var_os("LAYERS_SRC").map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), PathBuf::from);
    let krate = Crate::read(&src);
    let (modules_only, _) = krate.graph(false);
    let (graph, unresolved) = krate.graph(true);
    assert!(
        unresolved.is_empty(),
        "paths whose first segment is neither a module nor a name lib.rs brings in (teach this test the new form): {unresolved:#?}"
    );
    let found = cycles(&graph);
    eprintln!(
        "layers: {} modules, {} edges ({} through module paths alone), {} cycles",
        graph.len(),
        edges(&graph),
        edges(&modules_only),
        found.len()
    );
    for (from, to) in &graph {
        eprintln!("  {from} -> {}", to.keys().cloned().collect::<Vec<_>>().join(", "));
    }
    assert!(found.is_empty(), "core's top-level modules must form layers (see src/lib.rs); these modules use each other:\n{}", describe(&graph, &found));

    let map = layer_map(&fs::read_to_string(krate.src.join("lib.rs")).unwrap());
    let upward = against_map(&graph, &map);
    assert!(
        upward.is_empty(),
        "the layer map in lib.rs's docs is not the code's (move the thing down, take it as a trait or a value, or fix the map):\n{upward}"
    );
}

#[test]
fn the_reader_sees_what_it_should() {
    let src = r##"
        // crate::commented
        /* crate::block /* nested */ crate::still */
        const S: &str = "crate::quoted";
        const R: &str = r#"crate::raw "quoted""#;
        fn f<'a>(x: &'a str) -> char { '"' }
        use crate::{alpha, beta::{B, C}, self};
        #[cfg(test)]
        mod tests { use crate::gamma; }
        #[cfg(all(test, feature = "sqlite"))]
        use crate::delta;
        #[cfg(not(test))]
        use crate::epsilon::E;
        pub(crate) fn g() { crate::zeta::h(); }
    "##;
    let dir = std::env::temp_dir().join(format!("acemq-layers-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("lib.rs"), "mod one;\nmod two;\npub use two::Thing;\n").unwrap();
    fs::write(dir.join("one.rs"), src.replace("alpha", "two").replace("beta", "Thing")).unwrap();
    fs::write(dir.join("two.rs"), "fn f() { super::one::g(); }\n").unwrap();
    let krate = Crate::read(&dir);
    fs::remove_dir_all(&dir).unwrap();
    let firsts: Vec<&str> = krate.uses["one"].iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(firsts, ["two", "Thing", "epsilon", "zeta"]);
    let (graph, unresolved) = krate.graph(true);
    assert_eq!(unresolved.len(), 2, "epsilon and zeta are not modules here");
    assert_eq!(graph["one"].keys().collect::<Vec<_>>(), ["two"]);
    assert_eq!(graph["two"].keys().collect::<Vec<_>>(), ["one"]);
    assert_eq!(cycles(&graph), [vec!["one".to_string(), "two".to_string()]]);

    let lib = "//! # Layers\n//!\n//! | Layer | Modules | Why |\n//! |---|---|---|\n//! | top | `two` | a |\n//! | bottom | `one`, `three` | b |\n";
    let map = layer_map(lib);
    assert_eq!(map, [("top".to_string(), vec!["two".to_string()]), ("bottom".to_string(), vec!["one".to_string(), "three".to_string()])]);
    let found = against_map(&graph, &map);
    assert!(found.contains("`three` is not a module"), "{found}");
    assert!(found.contains("one (bottom) uses two (top), a row above it: one.rs:"), "{found}");
    assert!(!found.contains("two (top) uses"), "{found}");
}
