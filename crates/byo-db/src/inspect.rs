//! What the migrated database actually holds: its schema, normalised so the PostgreSQL and
//! SQLite schemas can be compared, and a text dump of every value, so a test can prove no
//! table holds a plaintext token.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Pool, Result, Store};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schema {
    pub tables: BTreeMap<String, TableSchema>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableSchema {
    pub columns: BTreeMap<String, Column>,
    pub primary_key: Vec<String>,
    /// Unique indexes and constraints, by columns and predicate (names differ by backend).
    pub uniques: BTreeSet<Unique>,
    pub foreign_keys: BTreeSet<ForeignKey>,
    /// Named check constraints: name → the expression, normalised ([`normalise_expr`]).
    pub checks: BTreeMap<String, String>,
    /// Non-unique indexes created by name: name → columns and predicate.
    pub indexes: BTreeMap<String, Index>,
    /// Triggers: name → when they fire (`before update`, `after insert`, …).
    pub triggers: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Index {
    pub columns: Vec<String>,
    /// A partial index's `where`, normalised.
    pub predicate: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// One of text, integer, boolean, timestamptz, jsonb.
    pub ty: String,
    pub not_null: bool,
    pub has_default: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unique {
    pub columns: Vec<String>,
    /// A partial unique index's `where`, normalised.
    pub predicate: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ForeignKey {
    pub column: String,
    pub ref_table: String,
    pub ref_column: String,
    /// cascade, set null or no action.
    pub on_delete: String,
}

/// One stored value, as text.
#[derive(Clone, Debug)]
pub struct DumpedValue {
    pub table: String,
    pub column: String,
    pub value: String,
}

const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

fn canonical_type(ty: &str) -> String {
    match ty.to_ascii_lowercase().as_str() {
        "int" | "integer" | "int4" => "integer".into(),
        "timestamp with time zone" | "timestamptz" => "timestamptz".into(),
        other => other.into(),
    }
}

fn canonical_on_delete(action: &str) -> String {
    match action.to_ascii_lowercase().as_str() {
        "c" | "cascade" => "cascade".into(),
        "n" | "set null" => "set null".into(),
        "r" | "restrict" => "restrict".into(),
        "d" | "set default" => "set default".into(),
        _ => "no action".into(),
    }
}

/// An SQL expression (a check's or a partial index's `where`) as one comparable text, so
/// SQLite's, kept as written, and PostgreSQL's, deparsed, compare equal exactly when they
/// say the same thing: lowercase; PostgreSQL's casts (`'a'::text`) dropped; its
/// `= any (array[…])` read back as `in (…)`; `x between a and b` spelled `x >= a and x <= b`;
/// then every parenthesis dropped and whitespace collapsed. Grouping is therefore not
/// compared — operators, operands, literals and their order are.
pub fn normalise_expr(expr: &str) -> String {
    let mut s = expr.to_ascii_lowercase().replace("!=", "<>");
    for cast in [
        "::timestamp with time zone",
        "::text[]",
        "::text",
        "::integer",
        "::bigint",
        "::numeric",
        "::boolean",
        "::jsonb",
        "::date",
        "::character varying",
        "::double precision",
    ] {
        s = s.replace(cast, "");
    }
    // `x = any (array['a', 'b'])` → `x in ('a', 'b')`; `x <> all (…)` → `x not in (…)`.
    for (from, to) in [("= any (array[", "in ("), ("<> all (array[", "not in (")] {
        while let Some(at) = s.find(from) {
            let rest = &s[at + from.len()..];
            let Some(end) = rest.find("])") else { break };
            s = format!("{}{to}{}){}", &s[..at], &rest[..end], &rest[end + 2..]);
        }
    }
    let words = |s: &str| -> Vec<String> {
        s.replace(['(', ')'], " ")
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let mut w = words(&s);
    // `x between a and b` → `x >= a and x <= b` (operands are single words once
    // parentheses are gone, which is all our checks use).
    while let Some(i) = w.iter().position(|t| t == "between") {
        if i == 0 || i + 3 >= w.len() || w[i + 2] != "and" {
            break;
        }
        let (a, b) = (w[i + 1].clone(), w[i + 3].clone());
        let mut x_words = vec![w[i - 1].clone()];
        // A function call lost its parentheses: `length depool_reason` is two words.
        if i >= 2
            && w[i - 2]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !["or", "and", "not", "is"].contains(&w[i - 2].as_str())
        {
            x_words.insert(0, w[i - 2].clone());
        }
        let start = i - x_words.len();
        let mut replacement = x_words.clone();
        replacement.extend([">=".to_owned(), a, "and".to_owned()]);
        replacement.extend(x_words);
        replacement.extend(["<=".to_owned(), b]);
        w.splice(start..i + 4, replacement);
    }
    w.join(" ").replace(" ,", ",")
}

/// `constraint <name> check (<expr>)` clauses in a CREATE TABLE statement, name →
/// normalised expression; SQLite keeps no catalogue of checks, only the statement.
fn checks_in(create_sql: &str) -> BTreeMap<String, String> {
    let lower = create_sql.to_ascii_lowercase();
    let mut out = BTreeMap::new();
    // Each occurrence read on its own (no cursor carried from one to the next, so no
    // arithmetic slip can loop forever); our checks hold no word `constraint` inside.
    for (at, word) in lower.match_indices("constraint") {
        let from = at + word.len();
        // A word of its own, not part of a name.
        let before = lower[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let mut words = lower[from..].split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        if !kind.starts_with("check") {
            continue;
        }
        // The first parenthesis after the name opens the check's expression.
        let Some(open) = lower[from..].find('(').map(|i| from + i) else {
            continue;
        };
        let mut depth = 0;
        let Some(end) = lower[open..].char_indices().find_map(|(i, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(open + i)
        }) else {
            // Never closed: not a statement SQLite accepted; nothing further to read.
            break;
        };
        out.insert(
            name.trim_matches('"').to_owned(),
            // Parentheses and all: the normaliser drops them.
            normalise_expr(&create_sql[open..=end]),
        );
    }
    out
}

/// When a CREATE TRIGGER statement fires: `before update`, `after insert`, ….
fn trigger_event(create_trigger: &str) -> String {
    let words: Vec<String> = create_trigger
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect();
    let timing = words
        .iter()
        .position(|w| ["before", "after", "instead"].contains(&w.as_str()));
    match timing {
        Some(i) => {
            // From the timing word on: it is no event itself.
            let event = words[i..]
                .iter()
                .find(|w| ["insert", "update", "delete"].contains(&w.as_str()))
                .cloned()
                .unwrap_or_default();
            format!("{} {event}", words[i])
        }
        None => String::new(),
    }
}

/// The `where` of a CREATE INDEX statement, normalised.
fn predicate_of(create_index: &str) -> Option<String> {
    let lower = create_index.to_ascii_lowercase();
    let at = lower.find(" where ")?;
    Some(normalise_expr(&create_index[at + " where ".len()..]))
}

impl Store {
    pub async fn schema(&self) -> Result<Schema> {
        match &self.pool {
            Pool::Postgres(p) => postgres_schema(p).await,
            Pool::Sqlite(p) => sqlite_schema(p).await,
        }
    }

    /// Every non-null value in every table, cast to text by the database itself.
    pub async fn dump_text(&self) -> Result<Vec<DumpedValue>> {
        let schema = self.schema().await?;
        let mut out = Vec::new();
        for (table, t) in &schema.tables {
            for column in t.columns.keys() {
                // Names come from the catalogue, not from input.
                let sql = format!(
                    r#"select cast("{column}" as text) from "{table}" where "{column}" is not null"#
                );
                let values: Vec<String> = on_pool!(self, |p| sqlx::query_scalar(
                    sqlx::AssertSqlSafe(sql.clone())
                )
                .fetch_all(p)
                .await)?;
                out.extend(values.into_iter().map(|value| DumpedValue {
                    table: table.clone(),
                    column: column.clone(),
                    value,
                }));
            }
        }
        Ok(out)
    }
}

async fn postgres_schema(p: &sqlx::PgPool) -> Result<Schema> {
    let mut schema = Schema::default();
    let columns: Vec<(String, String, String, bool, bool)> = sqlx::query_as(
        "select table_name::text, column_name::text, data_type::text, is_nullable = 'NO',
                column_default is not null
         from information_schema.columns where table_schema = 'public'",
    )
    .fetch_all(p)
    .await?;
    for (table, column, ty, not_null, has_default) in columns {
        if table == MIGRATIONS_TABLE {
            continue;
        }
        schema.tables.entry(table).or_default().columns.insert(
            column,
            Column {
                ty: canonical_type(&ty),
                not_null,
                has_default,
            },
        );
    }
    let indexes: Vec<(String, String, bool, bool, Option<String>, String)> = sqlx::query_as(
        "select t.relname::text, i.relname::text, ix.indisunique, ix.indisprimary,
                pg_get_expr(ix.indpred, ix.indrelid),
                array_to_string(array(
                  select a.attname from unnest(ix.indkey) with ordinality k(attnum, ord)
                  join pg_attribute a on a.attrelid = t.oid and a.attnum = k.attnum
                  order by k.ord), ',')
         from pg_index ix
         join pg_class t on t.oid = ix.indrelid
         join pg_class i on i.oid = ix.indexrelid
         join pg_namespace n on n.oid = t.relnamespace
         where n.nspname = 'public'",
    )
    .fetch_all(p)
    .await?;
    for (table, name, unique, primary, predicate, cols) in indexes {
        let Some(t) = schema.tables.get_mut(&table) else {
            continue;
        };
        let columns: Vec<String> = cols.split(',').map(str::to_owned).collect();
        let predicate = predicate.as_deref().map(normalise_expr);
        if primary {
            t.primary_key = columns;
        } else if unique {
            t.uniques.insert(Unique { columns, predicate });
        } else {
            t.indexes.insert(name, Index { columns, predicate });
        }
    }
    let fks: Vec<(String, String, String, String, String)> = sqlx::query_as(
        "select c.conrelid::regclass::text, a.attname::text, c.confrelid::regclass::text,
                af.attname::text, c.confdeltype::text
         from pg_constraint c
         join pg_attribute a on a.attrelid = c.conrelid and a.attnum = c.conkey[1]
         join pg_attribute af on af.attrelid = c.confrelid and af.attnum = c.confkey[1]
         where c.contype = 'f' and c.connamespace = 'public'::regnamespace",
    )
    .fetch_all(p)
    .await?;
    for (table, column, ref_table, ref_column, on_delete) in fks {
        if let Some(t) = schema.tables.get_mut(&table) {
            t.foreign_keys.insert(ForeignKey {
                column,
                ref_table,
                ref_column,
                on_delete: canonical_on_delete(&on_delete),
            });
        }
    }
    let checks: Vec<(String, String, String)> = sqlx::query_as(
        "select conrelid::regclass::text, conname::text, pg_get_constraintdef(oid)
         from pg_constraint
         where contype = 'c' and connamespace = 'public'::regnamespace",
    )
    .fetch_all(p)
    .await?;
    for (table, name, def) in checks {
        if let Some(t) = schema.tables.get_mut(&table) {
            let expr = def
                .strip_prefix("CHECK ")
                .unwrap_or(&def)
                .trim_end_matches(" NOT VALID");
            t.checks.insert(name, normalise_expr(expr));
        }
    }
    // One row per event; a trigger here fires on one event, as SQLite's can.
    let triggers: Vec<(String, String, String, String)> = sqlx::query_as(
        "select event_object_table::text, trigger_name::text, action_timing::text,
                event_manipulation::text
         from information_schema.triggers where trigger_schema = 'public'",
    )
    .fetch_all(p)
    .await?;
    for (table, name, timing, event) in triggers {
        if let Some(t) = schema.tables.get_mut(&table) {
            t.triggers.insert(
                name,
                format!(
                    "{} {}",
                    timing.to_ascii_lowercase(),
                    event.to_ascii_lowercase()
                ),
            );
        }
    }
    Ok(schema)
}

async fn sqlite_schema(p: &sqlx::SqlitePool) -> Result<Schema> {
    let mut schema = Schema::default();
    let tables: Vec<(String, String)> = sqlx::query_as(
        "select name, sql from sqlite_master
         where type = 'table' and name not like 'sqlite_%' and name <> '_sqlx_migrations'",
    )
    .fetch_all(p)
    .await?;
    for (table, create_sql) in tables {
        let mut t = TableSchema {
            checks: checks_in(&create_sql),
            ..Default::default()
        };
        let columns: Vec<(String, String, bool, bool, i64)> = sqlx::query_as(
            r#"select name, type, "notnull", dflt_value is not null, pk from pragma_table_info($1)"#,
        )
        .bind(&table)
        .fetch_all(p)
        .await?;
        let mut pk: Vec<(i64, String)> = Vec::new();
        for (name, ty, not_null, has_default, pk_pos) in columns {
            if pk_pos > 0 {
                pk.push((pk_pos, name.clone()));
            }
            t.columns.insert(
                name,
                Column {
                    ty: canonical_type(&ty),
                    not_null,
                    has_default,
                },
            );
        }
        pk.sort();
        t.primary_key = pk.into_iter().map(|(_, n)| n).collect();
        let indexes: Vec<(String, bool, String, Option<String>)> = sqlx::query_as(
            r#"select l.name, l."unique", l.origin, m.sql from pragma_index_list($1) l
               left join sqlite_master m on m.type = 'index' and m.name = l.name"#,
        )
        .bind(&table)
        .fetch_all(p)
        .await?;
        for (name, unique, origin, sql) in indexes {
            if origin == "pk" {
                continue;
            }
            let columns: Vec<String> =
                sqlx::query_scalar("select name from pragma_index_info($1) order by seqno")
                    .bind(&name)
                    .fetch_all(p)
                    .await?;
            let predicate = sql.as_deref().and_then(predicate_of);
            if unique {
                t.uniques.insert(Unique { columns, predicate });
            } else {
                t.indexes.insert(name, Index { columns, predicate });
            }
        }
        let fks: Vec<(String, String, String, String)> = sqlx::query_as(
            r#"select "from", "table", "to", on_delete from pragma_foreign_key_list($1)"#,
        )
        .bind(&table)
        .fetch_all(p)
        .await?;
        for (column, ref_table, ref_column, on_delete) in fks {
            t.foreign_keys.insert(ForeignKey {
                column,
                ref_table,
                ref_column,
                on_delete: canonical_on_delete(&on_delete),
            });
        }
        schema.tables.insert(table, t);
    }
    let triggers: Vec<(String, String, String)> =
        sqlx::query_as("select tbl_name, name, sql from sqlite_master where type = 'trigger'")
            .fetch_all(p)
            .await?;
    for (table, name, sql) in triggers {
        if let Some(t) = schema.tables.get_mut(&table) {
            t.triggers.insert(name, trigger_event(&sql));
        }
    }
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_are_read_from_create_statements() {
        let sql = "create table hosts (id text,\n  constraint hosts_retired_inactive check (x = 1),\n  constraint hosts_slug_key unique (slug), constraint b check(length(y) between 1 and 5))";
        let checks: Vec<_> = checks_in(sql).into_iter().collect();
        assert_eq!(
            checks,
            vec![
                ("b".to_owned(), "length y >= 1 and length y <= 5".to_owned()),
                ("hosts_retired_inactive".to_owned(), "x = 1".to_owned())
            ]
        );
    }

    #[test]
    fn sqlite_as_written_and_postgres_deparsed_normalise_alike() {
        for (sqlite, postgres) in [
            (
                "state in ('pending', 'ready')",
                "(state = ANY (ARRAY['pending'::text, 'ready'::text]))",
            ),
            (
                "depool_reason is null or length(depool_reason) between 1 and 500",
                "((depool_reason IS NULL) OR ((length(depool_reason) >= 1) AND (length(depool_reason) <= 500)))",
            ),
            (
                "retired_at is null or (active = false and dedicated = false)",
                "((retired_at IS NULL) OR ((active = false) AND (dedicated = false)))",
            ),
            (
                "state = 'draft' or envelope is not null",
                "((state = 'draft'::text) OR (envelope IS NOT NULL))",
            ),
        ] {
            assert_eq!(normalise_expr(sqlite), normalise_expr(postgres), "{sqlite}");
        }
        // …and a weakened expression does not.
        assert_ne!(
            normalise_expr("consecutive_failures > 0"),
            normalise_expr("(consecutive_failures >= 0)")
        );
        assert_ne!(
            normalise_expr("state in ('pending', 'ready')"),
            normalise_expr("(state = ANY (ARRAY['pending'::text, 'ready'::text, 'x'::text]))")
        );
    }

    // Fixed vectors: both backends pass through the same normaliser, so comparing the two
    // sides alone cannot notice a normaliser that changes both alike (issue #19's survivors).
    #[test]
    fn the_normaliser_spells_each_form_one_way() {
        for (input, want) in [
            (
                "(state = ANY (ARRAY['a'::text, 'b'::text]))",
                "state in 'a', 'b'",
            ),
            ("(state <> ALL (ARRAY['a'::text]))", "state not in 'a'"),
            ("x != 1", "x <> 1"),
            ("(at::timestamp with time zone) > (b::date)", "at > b"),
            ("n::bigint + m::integer + k::numeric", "n + m + k"),
            ("f::boolean = t::jsonb", "f = t"),
            ("v::character varying = w::double precision", "v = w"),
            ("tags::text[] = u::text", "tags = u"),
            ("x between 1 and 5", "x >= 1 and x <= 5"),
            (
                "not length(r) between 1 and 5",
                "not length r >= 1 and length r <= 5",
            ),
            ("a or b between 1 and 2", "a or b >= 1 and b <= 2"),
            // A function's name is a word (underscores too); an operator before the operand is not.
            (
                "a = b + char_length(r) between 1 and 5",
                "a = b + char_length r >= 1 and char_length r <= 5",
            ),
            ("n + x between 1 and 5", "n + x >= 1 and x <= 5"),
            ("between 1 and 2", "between 1 and 2"),
            ("x between 1 or 2", "x between 1 or 2"),
            ("  A   AND\n B ", "a and b"),
        ] {
            assert_eq!(normalise_expr(input), want, "{input}");
        }
    }

    #[test]
    fn column_types_and_delete_actions_have_one_spelling() {
        for (ty, want) in [
            ("INT", "integer"),
            ("integer", "integer"),
            ("int4", "integer"),
            ("timestamp with time zone", "timestamptz"),
            ("TIMESTAMPTZ", "timestamptz"),
            ("text", "text"),
            ("BigInt", "bigint"),
        ] {
            assert_eq!(canonical_type(ty), want, "{ty}");
        }
        for (action, want) in [
            ("c", "cascade"),
            ("CASCADE", "cascade"),
            ("n", "set null"),
            ("SET NULL", "set null"),
            ("r", "restrict"),
            ("restrict", "restrict"),
            ("d", "set default"),
            ("set default", "set default"),
            ("a", "no action"),
            ("NO ACTION", "no action"),
        ] {
            assert_eq!(canonical_on_delete(action), want, "{action}");
        }
    }

    #[test]
    fn only_whole_word_check_constraints_are_read() {
        let sql = "create table t (myconstraint int, \"x\" text,\n  constraint \"quoted\" check (a in (1, 2)),\n  constraint u unique (x),\n  constraint nested check ((a > 0) and (b < (c + 1))), constraint last check (z = 'x'))";
        let checks: Vec<_> = checks_in(sql).into_iter().collect();
        assert_eq!(
            checks,
            vec![
                ("last".to_owned(), "z = 'x'".to_owned()),
                ("nested".to_owned(), "a > 0 and b < c + 1".to_owned()),
                ("quoted".to_owned(), "a in 1, 2".to_owned()),
            ]
        );
        // A column whose name ends in `constraint`, checked inline, is not a named check.
        for inline in [
            "create table t (myconstraint text check (myconstraint <> ''))",
            "create table t (no_constraint text check (no_constraint <> ''))",
        ] {
            assert!(checks_in(inline).is_empty(), "{inline}");
        }
        // An expression never closed is no check (and no panic).
        assert!(checks_in("create table t (constraint c check (a > (b)").is_empty());
        assert!(checks_in("create table t (a int)").is_empty());
        assert!(checks_in("create table t (a int, constraint)").is_empty());
    }

    #[test]
    fn index_predicates_and_trigger_timings_are_read() {
        assert_eq!(
            predicate_of("CREATE UNIQUE INDEX i ON t (a) WHERE (retired_at IS NULL)"),
            Some("retired_at is null".to_owned())
        );
        assert_eq!(predicate_of("create index i on t (a)"), None);
        assert_eq!(
            trigger_event("create trigger t instead of delete on v"),
            "instead delete"
        );
        assert_eq!(trigger_event("create trigger t on x"), "");
        // The event is the first after the timing, whatever the words before it.
        assert_eq!(
            trigger_event("create trigger delete after insert on x"),
            "after insert"
        );
        assert_eq!(trigger_event("create trigger t after on x"), "after ");
    }

    #[test]
    fn trigger_events_are_read_from_create_statements() {
        assert_eq!(
            trigger_event("create trigger t before update of placement on hosts begin end"),
            "before update"
        );
        assert_eq!(
            trigger_event("CREATE TRIGGER t AFTER INSERT ON x"),
            "after insert"
        );
    }
}
