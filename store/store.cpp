// Placeholder translation unit so the kiln_store library exists before its issue lands.
namespace kiln::store {}
