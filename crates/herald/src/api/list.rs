//! Svix list pagination: `limit`, `iterator`, `order` in; `data`, `iterator`,
//! `prevIterator`, `done` out. Ids sort by creation time, so an iterator is an item's id:
//! `iterator` is the last item's, for the next page; `prevIterator` is the first item's
//! with a `-`, for the page before, which keeps the display order. `done` says whether more
//! items exist in the direction asked. A malformed iterator is a 422.

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
    /// Left out of an empty page, as Svix does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_iterator: Option<String>,
    pub done: bool,
}

/// What a list's iterators are: ids with this prefix, or event type names.
#[derive(Debug, Clone, Copy)]
pub enum Cursor {
    Id(&'static str),
    Name,
}

impl Cursor {
    fn accepts(self, value: &str) -> bool {
        let slug = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        match self {
            Self::Id(prefix) => value.strip_prefix(prefix).is_some_and(crate::ids::is_id_body),
            Self::Name => !value.is_empty() && value.len() <= 256 && slug(value),
        }
    }
}

/// The order a list is shown in: applications and endpoints take `order` (their default
/// given here); messages, attempts and event types have one order, as in Svix, and ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Oldest first (by id, i.e. creation).
    Ascending,
    Descending,
    /// Always ascending (event types: by name).
    AlwaysAscending,
    AlwaysDescending,
}

/// A 422 about a query parameter, in Svix's shape (`loc` under `query`).
fn invalid(loc: &[&str], msg: &str) -> ApiError {
    let loc = std::iter::once("query").chain(loc.iter().copied()).map(str::to_owned).collect();
    ApiError::Validation(vec![ValidationItem { loc, msg: msg.to_owned(), kind: "value_error".into() }])
}

/// The page a request asks for.
#[derive(Debug, Clone)]
pub struct Page {
    limit: usize,
    /// The id (or name) the page starts after.
    after: Option<String>,
    /// The display order.
    descending: bool,
    /// Asked with `iterator=-…`: the page before `after`.
    backwards: bool,
}

impl Page {
    /// Reads `limit`, `iterator` and `order` (when the list supports it: `order` then
    /// replaces `default`).
    pub fn from_query(query: &QueryMap, default: Order, cursor: Cursor) -> ApiResult<Self> {
        let limit = query.get::<usize>("limit")?.unwrap_or(DEFAULT_LIMIT);
        if limit > MAX_LIMIT {
            return Err(invalid(&["limit"], "Given limit must not exceed 250"));
        }
        if limit == 0 {
            return Err(invalid(&["limit"], "Given limit must be at least 1"));
        }
        let descending = match (default, query.get::<String>("order")?.as_deref()) {
            (Order::AlwaysAscending, _) => false,
            (Order::AlwaysDescending, _) => true,
            (_, Some("ascending")) => false,
            (_, Some("descending")) => true,
            (_, None) => default == Order::Descending,
            (_, Some(_)) => return Err(invalid(&["order"], "must be ascending or descending")),
        };
        let (backwards, after) = match query.get::<String>("iterator")? {
            None => (false, None),
            Some(iterator) => {
                let (backwards, id) = iterator.strip_prefix('-').map_or((false, iterator.as_str()), |id| (true, id));
                if !cursor.accepts(id) {
                    return Err(invalid(&["iterator", "__all__"], "Invalid id. Expected different prefix"));
                }
                (backwards, Some(id.to_owned()))
            }
        };
        Ok(Self { limit, after, descending, backwards })
    }

    /// The store query: one row more than the page, to know whether more follow; a page
    /// backwards is read in the opposite order from its iterator.
    pub fn query(&self) -> PageQuery {
        PageQuery { limit: self.limit + 1, iterator: self.after.clone(), descending: self.descending != self.backwards }
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
        if self.backwards {
            items.reverse();
        }
        let iterator = items.last().map(&key);
        let prev_iterator = items.first().map(|first| format!("-{}", key(first)));
        ListResponse { data: items.into_iter().map(render).collect(), iterator, prev_iterator, done }
    }
}
