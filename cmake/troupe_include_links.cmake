# Headers are included as <troupe/module/header.hpp>, in the tree as once installed:
# troupe_include_links(ROOT DIR) makes DIR/troupe hold one link per module folder of the
# source tree ROOT (not a link to the whole tree, which would contain the build folder
# itself), and the umbrella header. Put DIR on the include path.
set(TROUPE_MODULES core net devicemap store membership rpc collectives world training actors launcher)

function(troupe_include_links root dir)
  file(MAKE_DIRECTORY ${dir}/troupe)
  foreach(module IN LISTS TROUPE_MODULES)
    file(CREATE_LINK ${root}/${module} ${dir}/troupe/${module} SYMBOLIC)
  endforeach()
  file(CREATE_LINK ${root}/troupe.hpp ${dir}/troupe/troupe.hpp SYMBOLIC)
endfunction()
