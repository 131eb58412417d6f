// Placeholder translation unit so the kiln_tools library exists before its issue lands.
namespace kiln::tools {}
