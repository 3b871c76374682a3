//! The routes of the stream hubs (`journal_hub`, `run_hub`): one route for each id that streams
//! follow, made by its first follower and freed with its last, so a hub keeps (and looks at)
//! only what somebody follows. The two hubs kept this bookkeeping each in their own copy; what
//! a route holds is theirs.

use std::collections::HashMap;
use std::sync::Arc;

/// The routes of the ids followed now, each with how many follow it.
pub(crate) struct Followed<R> {
    routes: HashMap<Arc<str>, Counted<R>>,
}

struct Counted<R> {
    route: R,
    followers: usize,
}

impl<R> Default for Followed<R> {
    fn default() -> Self {
        Self {
            routes: HashMap::new(),
        }
    }
}

impl<R> Followed<R> {
    /// One more follower of `id`: its route (made by `make` when it is the first), and the id
    /// as the map holds it (shared with the follower, which leaves by it).
    pub(crate) fn follow(&mut self, id: &str, make: impl FnOnce() -> R) -> (Arc<str>, &mut R) {
        // The map's own key when followed already, so every follower shares one allocation.
        let id = match self.routes.get_key_value(id) {
            Some((held, _)) => Arc::clone(held),
            None => Arc::from(id),
        };
        let counted = self
            .routes
            .entry(Arc::clone(&id))
            .or_insert_with(|| Counted {
                route: make(),
                followers: 0,
            });
        counted.followers += 1;
        (id, &mut counted.route)
    }

    /// One follower of `id` less: its route goes with the last.
    pub(crate) fn leave(&mut self, id: &str) {
        if let Some(counted) = self.routes.get_mut(id) {
            counted.followers = counted.followers.saturating_sub(1);
            if counted.followers == 0 {
                self.routes.remove(id);
            }
        }
    }

    /// The route of `id`, if it is followed.
    pub(crate) fn get(&self, id: &str) -> Option<&R> {
        self.routes.get(id).map(|counted| &counted.route)
    }

    /// The same, to change.
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut R> {
        self.routes.get_mut(id).map(|counted| &mut counted.route)
    }

    /// Every followed id and its route.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&Arc<str>, &mut R)> {
        self.routes
            .iter_mut()
            .map(|(id, counted)| (id, &mut counted.route))
    }

    /// Every route.
    pub(crate) fn routes_mut(&mut self) -> impl Iterator<Item = &mut R> {
        self.routes.values_mut().map(|counted| &mut counted.route)
    }

    /// Every followed id.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &Arc<str>> {
        self.routes.keys()
    }

    /// How many ids are followed (tests see routes freed).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether none is.
    pub(crate) fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Forget every route (their followers' channels close with them).
    pub(crate) fn clear(&mut self) {
        self.routes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_made_by_its_first_follower_and_freed_with_its_last() {
        let mut followed: Followed<Vec<u32>> = Followed::default();
        let (first, route) = followed.follow("run", Vec::new);
        route.push(1);
        let (second, route) = followed.follow("run", || unreachable!("made once"));
        assert_eq!(route, &vec![1], "the followers share the route");
        assert!(Arc::ptr_eq(&first, &second), "and the id");
        followed.follow("other", Vec::new);
        assert_eq!(followed.len(), 2);

        followed.leave("run");
        assert_eq!(followed.get("run"), Some(&vec![1]), "one follower is left");
        followed.leave("run");
        assert_eq!(followed.get("run"), None, "freed with its last follower");
        followed.leave("run");
        followed.leave("never followed");
        assert_eq!(
            followed.ids().map(|id| &**id).collect::<Vec<_>>(),
            ["other"]
        );
        let (_, route) = followed.follow("run", Vec::new);
        assert!(route.is_empty(), "a route made again starts anew");
    }
}
