//! Svix list pagination: `limit`, `iterator`, `order` in; `data`, `iterator`, `done` out.
//! Ids sort by creation time, so the iterator is just the last id of the page.

use serde::Serialize;

use super::error::{ApiError, ApiResult, ValidationItem};
use super::extract::QueryMap;
use crate::store::PageQuery;

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 250;

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse<T> {
    pub data: Vec<T>,
    pub iterator: Option<String>,
    pub prev_iterator: Option<String>,
    pub done: bool,
}

/// The page a request asks for.
#[derive(Debug, Clone)]
pub struct Page {
    limit: usize,
    iterator: Option<String>,
    descending: bool,
}

impl Page {
    /// Reads `limit`, `iterator` and (when the list supports it) `order`.
    pub fn from_query(query: &QueryMap, newest_first: bool) -> ApiResult<Self> {
        let limit = query.get::<usize>("limit")?.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::Validation(vec![ValidationItem::query(
                "limit",
                format!("must be between 1 and {MAX_LIMIT}"),
            )]));
        }
        let descending = match query.get::<String>("order")?.as_deref() {
            None => newest_first,
            Some("ascending") => false,
            Some("descending") => true,
            Some(other) => {
                return Err(ApiError::Validation(vec![ValidationItem::query(
                    "order",
                    format!("{other:?} is not ascending or descending"),
                )]));
            }
        };
        Ok(Self { limit, iterator: query.get("iterator")?, descending })
    }

    /// The store query: one row more than the page, to know whether more follow.
    pub fn query(&self) -> PageQuery {
        PageQuery { limit: self.limit + 1, iterator: self.iterator.clone(), descending: self.descending }
    }

    /// Trims the extra row and builds the response; `key` gives an item's iterator value.
    pub fn finish<T, O>(
        &self,
        mut items: Vec<T>,
        key: impl Fn(&T) -> String,
        render: impl FnMut(T) -> O,
    ) -> ListResponse<O> {
        let done = items.len() <= self.limit;
        items.truncate(self.limit);
        let iterator = items.last().map(&key);
        ListResponse { data: items.into_iter().map(render).collect(), iterator, prev_iterator: None, done }
    }
}
