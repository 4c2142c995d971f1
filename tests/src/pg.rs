//! A database of the test's own on the machine's PostgreSQL (127.0.0.1:5432, user
//! postgres; scripts/openadr3-vtn starts it where it is installed but not running),
//! dropped when the guard goes.

use crate::openadr3_vtn::{fresh_db, psql};

/// A fresh database, dropped (connections and all) on drop.
pub struct Db {
    pub name: String,
}

impl Db {
    pub fn new() -> Db {
        Db { name: fresh_db() }
    }

    /// Its URL for tokio-postgres (and `[store] url`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:5432/{}", self.name)
    }
}

impl Default for Db {
    fn default() -> Self {
        Db::new()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}
