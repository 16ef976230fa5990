//! placeholder until the macro engine lands
use proc_macro::TokenStream;
#[proc_macro_attribute]
pub fn idempotent(_a: TokenStream, i: TokenStream) -> TokenStream { i }
#[proc_macro_attribute]
pub fn single_flight(_a: TokenStream, i: TokenStream) -> TokenStream { i }
#[proc_macro_attribute]
pub fn distributed_lock(_a: TokenStream, i: TokenStream) -> TokenStream { i }
