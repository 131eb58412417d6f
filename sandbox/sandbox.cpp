// Placeholder translation unit so the kiln_sandbox library exists before its issue lands.
namespace kiln::sandbox {}
