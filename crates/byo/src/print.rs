//! How the customer's and owner's commands print: `--json` gives the API's own answer,
//! otherwise a table padded to its widest cells, or a few lines of `key  value`.

use chrono::{DateTime, Utc};
use clap::Args;
use serde::Serialize;

/// `--json`: the API's own types, one JSON document on standard output.
#[derive(Args, Clone, Copy)]
pub struct Output {
    /// Print the API's answer as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// `--json` prints `value` as the API gave it; otherwise the human form.
pub fn print_with<T: Serialize>(out: Output, value: &T, human: impl FnOnce() -> String) {
    if out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("the API's types serialise")
        );
    } else {
        print!("{}", human());
    }
}

/// One thing, a `key  value` line per fact.
pub fn details(lines: Vec<(&str, String)>) -> String {
    lines
        .into_iter()
        .map(|(k, v)| format!("{k:<15} {v}\n"))
        .collect()
}

/// Columns padded to their widest cell; `empty` when there are no rows.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>, empty: &str) -> String {
    if rows.is_empty() {
        return format!("{empty}\n");
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(headers.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        text.push_str(&line(row));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn a_table_pads_each_column_to_its_widest_cell_and_says_when_it_is_empty() {
        let text = table(
            &["NAME", "ID"],
            vec![
                vec!["a".into(), "1".into()],
                vec!["longer".into(), "2".into()],
            ],
            "none",
        );
        assert_eq!(text, "NAME    ID\na       1\nlonger  2\n");
        assert_eq!(table(&["NAME"], vec![], "none"), "none\n");
    }
}
