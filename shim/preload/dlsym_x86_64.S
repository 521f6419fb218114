/*
 * dlsym: our override. dlsym(RTLD_NEXT, ...) is resolved relative to the caller's return
 * address, so for RTLD_NEXT we tail-jump into the real dlsym with the caller's frame intact
 * (a normal call would make the shim the caller: HAMi issue #2903). Every other handle goes to
 * krex_dlsym_hook in lookup.c, which may hand back one of our wrappers.
 */
#if defined(__x86_64__)
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    .cfi_startproc
    cmpq $-1, %rdi                 /* RTLD_NEXT == (void *)-1 */
    jne krex_dlsym_hook
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp                  /* keep the stack 16-byte aligned for the call */
    .cfi_adjust_cfa_offset 8
    call krex_real_dlsym_get
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size dlsym, .-dlsym
#else
#error "the dlsym trampoline is written for x86-64 only"
#endif
    .section .note.GNU-stack,"",@progbits
