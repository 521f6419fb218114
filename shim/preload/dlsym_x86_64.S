/*
 * The loader entries the shim exports, as trampolines that keep the caller's frame: dlsym,
 * dlvsym and dlopen resolve relative to their caller's return address (RTLD_NEXT, the caller's
 * namespace and search path), so the common case tail-jumps into the real function with that
 * address intact (a normal call would make the shim the caller: HAMi issue #2903). dlsym and
 * dlvsym on any other handle go to krex_dlsym_hook / krex_dlvsym_hook (lookup.c), which may
 * hand back one of our wrappers; dlopen with RTLD_DEEPBIND goes to krex_dlopen_deep
 * (deepbind.c). The hidden krex_*_entry names are what deepbind.c writes into the GOTs of
 * deep-bound libraries.
 */
#if defined(__x86_64__)
    .text

/* Tail-jump into the real function that `getter` returns, the arguments (rdi, rsi, rdx) and
 * the caller's return address as they came; return NULL when there is none. */
.macro KREX_TAIL getter
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    pushq %rdx                     /* three pushes keep the call 16-byte aligned */
    .cfi_adjust_cfa_offset 8
    call \getter
    popq %rdx
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jz 1f
    jmp *%rax
1:  ret
.endm

.macro KREX_ENTRY name, hidden
    .globl \name
    .type \name, @function
    .globl \hidden
    .hidden \hidden
    .type \hidden, @function
\name:
\hidden:
.endm

    KREX_ENTRY dlsym, krex_dlsym_entry
    .cfi_startproc
    cmpq $-1, %rdi                 /* RTLD_NEXT == (void *)-1 */
    jne krex_dlsym_hook
    KREX_TAIL krex_real_dlsym_get
    .cfi_endproc
    .size dlsym, .-dlsym
    .size krex_dlsym_entry, .-krex_dlsym_entry

    KREX_ENTRY dlvsym, krex_dlvsym_entry
    .cfi_startproc
    cmpq $-1, %rdi
    jne krex_dlvsym_hook
    KREX_TAIL krex_real_dlvsym_get
    .cfi_endproc
    .size dlvsym, .-dlvsym
    .size krex_dlvsym_entry, .-krex_dlvsym_entry

    KREX_ENTRY dlopen, krex_dlopen_entry
    .cfi_startproc
    testl $0x8, %esi               /* RTLD_DEEPBIND */
    jnz krex_dlopen_deep
    KREX_TAIL krex_real_dlopen_get
    .cfi_endproc
    .size dlopen, .-dlopen
    .size krex_dlopen_entry, .-krex_dlopen_entry

/* dlsym as a deep-bound library calls it: RTLD_DEFAULT looks in the caller's own scope first
 * (lookup.c, krex_dlsym_default_deep); any other handle as dlsym. */
    .globl krex_dlsym_deep_entry
    .hidden krex_dlsym_deep_entry
    .type krex_dlsym_deep_entry, @function
krex_dlsym_deep_entry:
    .cfi_startproc
    testq %rdi, %rdi               /* RTLD_DEFAULT == NULL */
    jz krex_dlsym_default_deep
    jmp krex_dlsym_entry
    .cfi_endproc
    .size krex_dlsym_deep_entry, .-krex_dlsym_deep_entry
#else
#error "the loader trampolines are written for x86-64 only"
#endif
    .section .note.GNU-stack,"",@progbits
