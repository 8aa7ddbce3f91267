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
    /// Unique indexes and constraints, by columns (names differ by backend).
    pub uniques: BTreeSet<Unique>,
    pub foreign_keys: BTreeSet<ForeignKey>,
    /// Named check constraints.
    pub checks: BTreeSet<String>,
    /// Non-unique indexes created by name.
    pub indexes: BTreeSet<String>,
    pub triggers: BTreeSet<String>,
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
    pub partial: bool,
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

/// Names of `constraint <name> check (...)` clauses in a CREATE TABLE statement; SQLite
/// keeps no catalogue of checks, only the statement.
fn check_names(create_sql: &str) -> BTreeSet<String> {
    let words: Vec<String> = create_sql
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    words
        .windows(3)
        .filter(|w| w[0] == "constraint" && w[2] == "check")
        .map(|w| w[1].clone())
        .collect()
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
    let indexes: Vec<(String, String, bool, bool, bool, String)> = sqlx::query_as(
        "select t.relname::text, i.relname::text, ix.indisunique, ix.indisprimary,
                ix.indpred is not null,
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
    for (table, name, unique, primary, partial, cols) in indexes {
        let Some(t) = schema.tables.get_mut(&table) else {
            continue;
        };
        let columns: Vec<String> = cols.split(',').map(str::to_owned).collect();
        if primary {
            t.primary_key = columns;
        } else if unique {
            t.uniques.insert(Unique { columns, partial });
        } else {
            t.indexes.insert(name);
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
    let checks: Vec<(String, String)> = sqlx::query_as(
        "select conrelid::regclass::text, conname::text from pg_constraint
         where contype = 'c' and connamespace = 'public'::regnamespace",
    )
    .fetch_all(p)
    .await?;
    for (table, name) in checks {
        if let Some(t) = schema.tables.get_mut(&table) {
            t.checks.insert(name);
        }
    }
    let triggers: Vec<(String, String)> = sqlx::query_as(
        "select distinct event_object_table::text, trigger_name::text
         from information_schema.triggers where trigger_schema = 'public'",
    )
    .fetch_all(p)
    .await?;
    for (table, name) in triggers {
        if let Some(t) = schema.tables.get_mut(&table) {
            t.triggers.insert(name);
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
            checks: check_names(&create_sql),
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
        let indexes: Vec<(String, bool, String, bool)> =
            sqlx::query_as(r#"select name, "unique", origin, partial from pragma_index_list($1)"#)
                .bind(&table)
                .fetch_all(p)
                .await?;
        for (name, unique, origin, partial) in indexes {
            if origin == "pk" {
                continue;
            }
            let columns: Vec<String> =
                sqlx::query_scalar("select name from pragma_index_info($1) order by seqno")
                    .bind(&name)
                    .fetch_all(p)
                    .await?;
            if unique {
                t.uniques.insert(Unique { columns, partial });
            } else {
                t.indexes.insert(name);
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
    let triggers: Vec<(String, String)> =
        sqlx::query_as("select tbl_name, name from sqlite_master where type = 'trigger'")
            .fetch_all(p)
            .await?;
    for (table, name) in triggers {
        if let Some(t) = schema.tables.get_mut(&table) {
            t.triggers.insert(name);
        }
    }
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_are_read_from_create_statements() {
        let sql = "create table hosts (id text,\n  constraint hosts_retired_inactive check (x),\n  constraint hosts_slug_key unique (slug), constraint b check(y))";
        let names: Vec<_> = check_names(sql).into_iter().collect();
        assert_eq!(
            names,
            vec!["b".to_owned(), "hosts_retired_inactive".to_owned()]
        );
    }
}
