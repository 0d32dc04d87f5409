/* Preloaded into every process of the sanitizer run (tests/meson.build,
 * LD_PRELOAD in the sanitize setup): a dlclose that leaves the library
 * loaded. Open MPI unloads its components (mca_*.so) in MPI_Finalize; the
 * memory they allocated and never freed is then reported by LeakSanitizer
 * at exit with call stacks in no known module, which no suppression can
 * name. Kept loaded, those stacks name the component, and
 * tests/sanitize/lsan.supp can drop exactly Open MPI's leaks while the
 * allocator records stacks with the fast frame-pointer unwinder (the slow
 * unwinder that would otherwise be needed to reach a libmpi frame makes the
 * sanitized tests five times slower). Built without sanitizers: it is also
 * loaded into mpirun and the shell and Python of the command-line tests. */
int dlclose(void* handle);

int dlclose(void* handle) {
  (void)handle;
  return 0;
}
