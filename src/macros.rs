//! Macros shared by the middlewares.

/// Implements `get_ref`, `get_mut` and `into_inner` for a middleware service that keeps the
/// service it wraps in a field named `inner`, of the type parameter `S`:
///
/// ```text
/// inner_service_accessors!(RateLimit<S>);
/// inner_service_accessors!(KeyedRateLimit<S, F>);
/// ```
macro_rules! inner_service_accessors {
    ($name:ident < S $(, $param:ident)* >) => {
        impl<S $(, $param)*> $name<S $(, $param)*> {
            /// A reference to the inner service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// A mutable reference to the inner service.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// Consumes the middleware, returning the inner service.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }
    };
}

pub(crate) use inner_service_accessors;
