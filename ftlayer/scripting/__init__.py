"""The server-side Lua's Python side: generated layout constants, the loader of
``ftlayer/lua/*.lua`` (package data), each script's KEYS and ARGV, call bounds."""
