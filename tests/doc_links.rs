//! The README and the pages in `docs/` point at each other and into the
//! tree with relative links, and nothing else follows them: a page moved
//! or a heading reworded leaves a link that leads nowhere, on GitHub and
//! in a checkout alike. This test follows every relative link in
//! `README.md` and `docs/*.md` (to a file or a directory, and to a heading
//! when it names an `#anchor`, slugged as GitHub slugs headings) and fails
//! once, listing each broken link as `page:line: target (why)`. It also
//! holds the README to the front door it is meant to be: 300 lines at most.
//!
//! Only std: a markdown parser would be a dependency for a few pages. The
//! reading is narrow on purpose. Fenced code blocks and inline code spans
//! hold no links (the pages' examples are full of brackets and
//! parentheses that are not links), links are inline `[text](target)` or
//! reference definitions `[label]: target`, and headings are ATX (`#`).
#![cfg(not(target_arch = "wasm32"))]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Past this, the README turns back into the manual the pages in `docs/`
/// took over from it (issue 45).
const README_MAX_LINES: usize = 300;

/// A link as written: the line its target starts on, and the target.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    target: String,
}

/// The slugs of the markdown pages links point into, read once each:
/// several pages link to the same headings.
type Slugs = HashMap<PathBuf, Vec<String>>;

/// A fence's character and length, when `line` opens or closes one.
fn fence(line: &str) -> Option<(char, usize)> {
    let line = line.trim_start();
    let c = line.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = line.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// The lines outside fenced code blocks, numbered from 1, so that what an
/// example shows is never read as a link or a heading.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut open: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some(f)) => open = Some(f),
            // A closing fence is at least as long as its opening one and
            // carries nothing after it; anything else is the block's text.
            (Some((c, n)), Some((d, m))) if c == d && m >= n => {
                let rest = line.trim_start().trim_start_matches(c);
                if rest.trim().is_empty() {
                    open = None;
                }
            }
            (Some(_), _) => {}
            (None, None) => out.push((i + 1, line)),
        }
    }
    out
}

/// Runs of prose lines between blank lines and fences, each character with
/// its line number: a code span may go on past the end of a line, but not
/// past its paragraph.
fn paragraphs(text: &str) -> Vec<Vec<(usize, char)>> {
    let mut out: Vec<Vec<(usize, char)>> = Vec::new();
    let mut last = 0;
    for (n, line) in prose_lines(text) {
        if line.trim().is_empty() {
            last = 0;
            continue;
        }
        if n != last + 1 || last == 0 {
            out.push(Vec::new());
        }
        let paragraph = out.last_mut().expect("pushed above");
        paragraph.extend(line.chars().map(|c| (n, c)));
        paragraph.push((n, '\n'));
        last = n;
    }
    out
}

/// Where the code span whose opening run of `n` backticks ends at `from`
/// closes (just past its closing run), if it does: an unmatched run is
/// plain text, as CommonMark reads it.
fn code_span_end(cs: &[(usize, char)], from: usize, n: usize) -> Option<usize> {
    let mut i = from;
    while i < cs.len() {
        if cs[i].1 != '`' {
            i += 1;
            continue;
        }
        let run = cs[i..].iter().take_while(|(_, c)| *c == '`').count();
        if run == n {
            return Some(i + run);
        }
        i += run;
    }
    None
}

/// The destination of an inline link whose `(` ends at `start`: the
/// target, the line it starts on, and where the link ends. `None` when
/// what follows is no destination, as for prose that only happens to put
/// brackets before parentheses.
fn inline_target(cs: &[(usize, char)], start: usize) -> Option<(String, usize, usize)> {
    let skip_blanks = |mut i: usize| {
        while cs.get(i).is_some_and(|(_, c)| c.is_whitespace()) {
            i += 1;
        }
        i
    };
    let mut i = skip_blanks(start);
    let line = cs.get(i)?.0;
    let mut target = String::new();
    if cs[i].1 == '<' {
        i += 1;
        while cs.get(i)?.1 != '>' {
            target.push(cs[i].1);
            i += 1;
        }
        i += 1;
    } else {
        let mut depth = 0;
        while let Some(&(_, c)) = cs.get(i) {
            match c {
                ')' if depth == 0 => break,
                c if c.is_whitespace() => break,
                '(' => depth += 1,
                ')' => depth -= 1,
                '\\' => {
                    i += 1;
                    target.push(cs.get(i)?.1);
                    i += 1;
                    continue;
                }
                _ => {}
            }
            target.push(c);
            i += 1;
        }
    }
    i = skip_blanks(i);
    // A title ("...", '...' or (...)) may follow the destination.
    if let Some(close) = match cs.get(i)?.1 {
        '"' => Some('"'),
        '\'' => Some('\''),
        '(' => Some(')'),
        _ => None,
    } {
        i += 1;
        while cs.get(i)?.1 != close {
            i += 1;
        }
        i = skip_blanks(i + 1);
    }
    (cs.get(i)?.1 == ')').then_some((target, line, i + 1))
}

/// Every link of a page: inline links and images outside code, and the
/// targets of reference definitions.
fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        if let Some(target) = reference_definition(line) {
            out.push(Link {
                line: n,
                target: target.to_string(),
            });
        }
    }
    for cs in paragraphs(text) {
        let mut opens = 0usize;
        let mut i = 0;
        while i < cs.len() {
            match cs[i].1 {
                '\\' => i += 2,
                '`' => {
                    let n = cs[i..].iter().take_while(|(_, c)| *c == '`').count();
                    i = code_span_end(&cs, i + n, n).unwrap_or(i + n);
                }
                '[' => {
                    opens += 1;
                    i += 1;
                }
                ']' if opens > 0 && cs.get(i + 1).is_some_and(|(_, c)| *c == '(') => {
                    opens -= 1;
                    match inline_target(&cs, i + 2) {
                        Some((target, line, end)) => {
                            out.push(Link { line, target });
                            i = end;
                        }
                        None => i += 1,
                    }
                }
                ']' => {
                    opens = opens.saturating_sub(1);
                    i += 1;
                }
                _ => i += 1,
            }
        }
    }
    out.sort_by_key(|l| l.line);
    out
}

/// The target of a reference definition, `[label]: target`, on its line.
fn reference_definition(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = line.trim_start_matches(' ');
    if indent > 3 || !rest.starts_with('[') || rest.starts_with("[^") {
        return None;
    }
    let (label, after) = rest[1..].split_once("]:")?;
    if label.trim().is_empty() || label.contains('[') {
        return None;
    }
    let target = after.split_whitespace().next()?;
    Some(target.trim_start_matches('<').trim_end_matches('>'))
}

/// A heading's anchor as GitHub makes it: lower case, every character but
/// letters, digits, spaces, `-` and `_` dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The text of an ATX heading (`#` to `######`, then a space), without a
/// closing run of `#`.
fn heading(line: &str) -> Option<&str> {
    let rest = line.trim_start_matches(' ');
    if line.len() - rest.len() > 3 {
        return None;
    }
    let level = rest.chars().take_while(|c| *c == '#').count();
    let text = &rest[level..];
    if !(1..=6).contains(&level) || !(text.is_empty() || text.starts_with([' ', '\t'])) {
        return None;
    }
    let text = text.trim();
    let closed = text.trim_end_matches('#');
    Some(if closed.is_empty() || closed.ends_with(' ') {
        closed.trim_end()
    } else {
        text
    })
}

/// Every anchor a page's headings make, a repeated one numbered `-1`,
/// `-2`... in order, as GitHub numbers them.
fn slugs(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let Some(h) = heading(line) else { continue };
        let base = slug(h);
        let count = seen.entry(base.clone()).or_insert(0);
        out.push(match *count {
            0 => base,
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    out
}

/// Whether a target leaves the tree: a URL with a scheme (`https:`,
/// `mailto:`) or one starting `//`.
fn is_absolute(target: &str) -> bool {
    if target.starts_with("//") {
        return true;
    }
    let scheme = target.split_once(':').map_or("", |(s, _)| s);
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
}

/// A GitHub line anchor (`#L10`, `#L10-L20`), which a page that is not
/// markdown may take.
fn is_line_anchor(anchor: &str) -> bool {
    let line = |s: &str| {
        s.strip_prefix('L')
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    match anchor.split_once('-') {
        Some((from, to)) => line(from) && line(to),
        None => line(anchor),
    }
}

/// Why one link of the page at `page` (whose own headings make `own`)
/// leads nowhere, or `None` when it leads somewhere. `root` is the
/// repository's root, for targets written from it (`/docs/...`).
fn why_broken(
    root: &Path,
    page: &Path,
    own: &[String],
    target: &str,
    slugs_of: &mut Slugs,
) -> Option<String> {
    if target.is_empty() {
        return Some("an empty target".into());
    }
    if is_absolute(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path.is_empty() {
        let anchor = anchor.unwrap_or_default();
        return (!anchor.is_empty() && !own.iter().any(|s| s == anchor))
            .then(|| format!("no heading on this page has the slug `{anchor}`"));
    }
    let file = match path.strip_prefix('/') {
        Some(from_root) => root.join(from_root),
        None => page.parent().unwrap_or(root).join(path),
    };
    if !file.exists() {
        return Some("no such file or directory".into());
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if file.is_dir() {
        return Some("an anchor into a directory".into());
    }
    if file.extension().is_none_or(|e| e != "md") {
        return (!is_line_anchor(anchor))
            .then(|| "an anchor into a page that is not markdown".into());
    }
    if !slugs_of.contains_key(&file) {
        let text = fs::read_to_string(&file).unwrap_or_default();
        slugs_of.insert(file.clone(), slugs(&text));
    }
    let found = slugs_of[&file].iter().any(|s| s == anchor);
    (!found).then(|| format!("no heading in {path} has the slug `{anchor}`"))
}

/// Every broken link of one page, as `page:line: target (why)`, the page
/// named from `root`. The page's text is passed in, so that a page that
/// is not on disk can be checked too.
fn check_page(root: &Path, page: &Path, text: &str, slugs_of: &mut Slugs) -> Vec<String> {
    let own = slugs(text);
    let name = page.strip_prefix(root).unwrap_or(page).display();
    links(text)
        .into_iter()
        .filter_map(|link| {
            let why = why_broken(root, page, &own, &link.target, slugs_of)?;
            Some(format!("{name}:{}: {} ({why})", link.line, link.target))
        })
        .collect()
}

/// The crate's root: the README and `docs/` live there, whatever
/// directory the test runs from.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every `docs/*.md`, in a stable order.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    std::iter::once(root.join("README.md"))
        .chain(docs)
        .collect()
}

/// All pages at once, so that one run names every broken link rather than
/// the first.
#[test]
fn every_relative_link_in_the_readme_and_docs_leads_somewhere() {
    let root = root();
    let mut slugs_of = Slugs::new();
    let mut broken = Vec::new();
    for page in pages(&root) {
        let text = fs::read_to_string(&page).expect("a page is readable");
        broken.extend(check_page(&root, &page, &text, &mut slugs_of));
    }
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The README is the front door; the detail belongs in `docs/`.
#[test]
fn the_readme_is_at_most_300_lines() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md is readable");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to a page in docs/ and link to it"
    );
}

/// The checker itself: a page held in memory, beside a real page and
/// directory in a scratch tree, must have exactly its broken links
/// reported, and none of the look-alikes inside code.
#[test]
fn the_checker_reports_what_leads_nowhere_and_skips_code() {
    let tree = std::env::temp_dir().join(format!("edge-limiter-doc-links-{}", std::process::id()));
    fs::create_dir_all(tree.join("sub")).expect("scratch tree");
    fs::write(
        tree.join("other.md"),
        "# Other page\n\n## Its `part` two?\n",
    )
    .expect("other.md");
    fs::write(tree.join("code.rs"), "fn main() {}\n").expect("code.rs");
    let page = "# A page\n\
        \n\
        [fine](other.md), [fine](other.md#its-part-two), [dir](sub/), [here](#a-page).\n\
        [missing](no-such-file.md) and ![missing image](gone.png \"title\")\n\
        [bad anchor](other.md#no-such-heading) and [bad here](#nowhere)\n\
        `[in code](nowhere-1.md)` and ``[in `double` code](nowhere-2.md)``, a code\n\
        span `[across\n\
        lines](nowhere-3.md)`, [web](https://example.com/x) [mail](mailto:a@b.c)\n\
        \n\
        ```md\n\
        [in a fence](nowhere-4.md)\n\
        ```\n\
        \n\
        [def]: nowhere-5.md\n\
        ## A page\n\
        [second heading](#a-page-1), [a line](code.rs#L1), [no line](code.rs#main)\n";
    let mut slugs_of = Slugs::new();
    let broken = check_page(&tree, &tree.join("page.md"), page, &mut slugs_of);
    fs::remove_dir_all(&tree).ok();
    assert_eq!(
        broken,
        [
            "page.md:4: no-such-file.md (no such file or directory)",
            "page.md:4: gone.png (no such file or directory)",
            "page.md:5: other.md#no-such-heading (no heading in other.md has the slug `no-such-heading`)",
            "page.md:5: #nowhere (no heading on this page has the slug `nowhere`)",
            "page.md:14: nowhere-5.md (no such file or directory)",
            "page.md:16: code.rs#main (an anchor into a page that is not markdown)",
        ],
        "{broken:#?}"
    );
}

/// Slugs as GitHub makes them for headings these pages hold.
#[test]
fn headings_slug_as_github_slugs_them() {
    assert_eq!(
        slug("The `edge-limiter` command"),
        "the-edge-limiter-command"
    );
    assert_eq!(
        slug("Why is this customer blocked, and can I let them in?"),
        "why-is-this-customer-blocked-and-can-i-let-them-in"
    );
    assert_eq!(
        slug("A client's simultaneous requests"),
        "a-clients-simultaneous-requests"
    );
    assert_eq!(
        slugs("# A\n## A\n```\n# not a heading\n```\n### A ###\n"),
        ["a", "a-1", "a-2"]
    );
}
