// Placeholder translation unit so the kiln_agent library exists before its issue lands.
namespace kiln::agent {}
