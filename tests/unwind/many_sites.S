// Return addresses by the hundred thousand, for the unwinder's rule table:
// many_call_sites(site, f, arg) calls f(arg) from call site `site` of
// MANY_CALL_SITES (1.25 times the table's slots), all in one function whose
// CFA is rbp-based (each return address needs a rule of its own, and all
// have the same). large_frame(f, arg) calls f(arg) from a frame of 40,016
// bytes, a CFA offset wider than the rule table keeps.
#define MANY_CALL_SITES 327680

        .text
        .globl  many_call_sites
        .type   many_call_sites, @function
many_call_sites:
        .cfi_startproc
        pushq   %rbp
        .cfi_def_cfa_offset 16
        .cfi_offset %rbp, -16
        movq    %rsp, %rbp
        .cfi_def_cfa_register %rbp
        movq    %rsi, %rax
        movslq  %edi, %rcx
        leaq    1f(%rip), %rsi
        leaq    (%rsi,%rcx,8), %rcx
        movq    %rdx, %rdi
        jmp     *%rcx
        // Each site is 8 bytes: the call and a jump to the end.
        .balign 8
1:
        .rept   MANY_CALL_SITES
        .balign 8
        call    *%rax
        jmp     9f
        .endr
9:
        popq    %rbp
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_endproc
        .size   many_call_sites, .-many_call_sites

        .globl  many_call_site_count
        .section .rodata
        .balign 4
        .type   many_call_site_count, @object
        .size   many_call_site_count, 4
many_call_site_count:
        .long   MANY_CALL_SITES

        .text
        .globl  large_frame
        .type   large_frame, @function
large_frame:
        .cfi_startproc
        subq    $40008, %rsp
        .cfi_def_cfa_offset 40016
        movq    %rdi, %rax
        movq    %rsi, %rdi
        call    *%rax
        addq    $40008, %rsp
        .cfi_def_cfa_offset 8
        ret
        .cfi_endproc
        .size   large_frame, .-large_frame

        .section .note.GNU-stack,"",@progbits
